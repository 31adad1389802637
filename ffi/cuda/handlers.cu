// XLA FFI handlers of the CUDA platform: decode buffers, choose the kernel
// instantiation (dtype x padded head dim) in this one place, launch on XLA's
// stream. Nothing here allocates or synchronizes (scratch buffers are extra
// results that XLA allocates), so the handlers are safe inside CUDA graphs.
#include "cuda/handlers.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/ffi_bindings.h"
#include "common/feature_decode.h"
#include "common/ffi_decode.h"
#include "common/paged_decode.h"
#include "cuda/decode/launch.h"
#include "cuda/generic/launch.h"
#include "cuda/sm80/launch.h"
#ifdef JAX_FLASH_WITH_SM90
#include "cuda/sm90/bwd_launch.h"
#include "cuda/sm90/launch.h"
#endif

namespace jax_flash::cuda {
namespace {

// Calls fn(Element{}, std::integral_constant<int, kHeadDim>{}) for the
// instantiation that serves this dtype and head dim.
template <typename Fn>
ffi::Error Dispatch(ffi::DataType dtype, const AttentionShape& shape, Fn&& fn) {
  const int64_t head_dim = shape.head_dim;
  auto by_head_dim = [&](auto element) -> std::string {
    if (head_dim <= 32) return fn(element, std::integral_constant<int, 32>{});
    if (head_dim <= 64) return fn(element, std::integral_constant<int, 64>{});
    if (head_dim <= 128) return fn(element, std::integral_constant<int, 128>{});
    if (head_dim <= 256) return fn(element, std::integral_constant<int, 256>{});
    return "jax_flash: head dim " + std::to_string(head_dim) +
           " is not supported on the GPU (at most 256)";
  };
  std::string err;
  switch (dtype) {
    case ffi::DataType::F16: err = by_head_dim(__half{}); break;
    case ffi::DataType::BF16: err = by_head_dim(__nv_bfloat16{}); break;
    case ffi::DataType::F32: err = by_head_dim(float{}); break;
    case ffi::DataType::F64:
      return ffi::Error::InvalidArgument(
          "jax_flash: float64 is not supported by the CUDA kernels; use float32 or run on the CPU");
    default:
      return ffi::Error::InvalidArgument(
          "jax_flash: unsupported dtype; expected float16, bfloat16 or float32");
  }
  if (!err.empty()) return InternalWithShape(err, shape);
  return ffi::Error::Success();
}

// Kernel families, as the Python `implementation` argument names them.
enum class Family : int32_t { kAuto = 0, kGeneric = 1, kSm80 = 2, kSm90 = 3 };

int DeviceAttribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&value, attr, device) != cudaSuccess)
    return 0;
  return value;
}

// The mma.sync kernels take 16-bit inputs whose rows are whole 16-byte
// chunks, and need `smem_bytes` of shared memory per block.
bool Sm80Supports(ffi::DataType dtype, int64_t head_dim, int smem_bytes) {
  return (dtype == ffi::DataType::F16 || dtype == ffi::DataType::BF16) && head_dim % 8 == 0 &&
         head_dim <= 256 && DeviceAttribute(cudaDevAttrComputeCapabilityMajor) >= 8 &&
         DeviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) >= smem_bytes;
}

// Calls fn(Element{}, std::integral_constant<int, kHeadDim>{}) for 16-bit
// dtypes with the head dim rounded up to 64, 128 or 256.
template <typename Fn>
ffi::Error DispatchTensorCores(ffi::DataType dtype, const AttentionShape& shape, Fn&& fn) {
  const int64_t head_dim = shape.head_dim;
  auto by_head_dim = [&](auto element) -> std::string {
    if (head_dim <= 64) return fn(element, std::integral_constant<int, 64>{});
    if (head_dim <= 128) return fn(element, std::integral_constant<int, 128>{});
    return fn(element, std::integral_constant<int, 256>{});
  };
  const std::string err = dtype == ffi::DataType::F16 ? by_head_dim(__half{})
                                                      : by_head_dim(__nv_bfloat16{});
  if (!err.empty()) return InternalWithShape(err, shape);
  return ffi::Error::Success();
}

// The attention features the Hopper kernels' variants take, forward and
// backward (sm90::LaunchForwardWithFeatures, LaunchBackwardWithFeatures):
// lengths, windows, position offsets, segment ids and either the soft cap
// or dropout (kMasksSoftcap / kSoftcap, kMasksDropout; kPlainSoftcap,
// kPlainDropout where the transform is the call's only feature). A bias, a
// boolean mask and dropout with the soft cap stay on the sm80 kernels (a
// bias and a mask: Sm90ForwardTakesFeatures, the backward's bias
// variants).
bool Sm90TakesFeatures(const AttentionParams& p) {
  const AttentionFeatures& f = p.features;
  if (!f.Any()) return true;
  return !(f.bias || f.mask || (f.dropout_rate > 0.0 && f.softcap > 0.0));
}

// The forward's: those, or with the masks' features either a bias (the
// kMasksBias variant, feature_mask.cuh's BiasRows, for a float32 one;
// kMasksBias16 for one of the inputs' 16-bit dtype, read at half the bytes,
// kMasksBiasTiles for such a bias whose rows TMA can copy, bias_tiles.cuh;
// without the soft cap or dropout) or a boolean mask (kMasksBoolean,
// MaskArrayRows; beside the soft cap kMasksSoftcap reads it, beside dropout
// kMasksDropout a key-only one), not both, contiguous along the keys
// (broadcast over batch, heads or queries); the bias up to head dim 128,
// the rest at every head dim (at 256 on 64-key blocks where a variant
// reads mask bytes or draws dropout: LaunchForwardWithFeatures). The
// backward (Sm90BackwardSupports) decides for itself: any family's gives
// the same gradients of the same out and lse.
bool Sm90ForwardTakesFeatures(const AttentionParams& p) {
  const AttentionFeatures& f = p.features;
  if (!f.bias && !f.mask) return Sm90TakesFeatures(p);
  // (A bias above 128 stays on sm80's forward: LaunchForwardWithFeatures.)
  if (f.bias && (f.mask || p.shape.head_dim > 128)) return false;
  // A boolean mask beside the soft cap (sm90::ReadsMaskArray: key-only or
  // per query), or a key-only one (key padding) beside dropout
  // (sm90::TakesKeyMaskBeside): their variants read its bytes.
  if (f.mask && f.mask_stride.col == 1 &&
      (f.softcap > 0.0 || (f.mask_stride.row == 0 && f.dropout_rate > 0.0))) {
    AttentionParams without = p;
    without.features.mask = nullptr;
    return Sm90TakesFeatures(without);
  }
  return !(f.dropout_rate > 0.0) && !(f.softcap > 0.0) && (f.bias ? f.bias_stride.col == 1 : f.mask_stride.col == 1);
}

// Whether the Hopper forward (sm90/) serves this call: built with sm_90a,
// a 9.x device, 16-bit inputs, head dim a multiple of 8 up to 256, scale > 0,
// features it takes (Sm90ForwardTakesFeatures). (Its launcher checks
// alignment itself and fails clearly.)
bool Sm90ForwardSupports(ffi::DataType dtype, const AttentionParams& p) {
#ifdef JAX_FLASH_WITH_SM90
  return (dtype == ffi::DataType::F16 || dtype == ffi::DataType::BF16) && p.shape.head_dim % 8 == 0 &&
         p.shape.head_dim <= 256 && p.scale > 0 && Sm90ForwardTakesFeatures(p) &&
         DeviceAttribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
         DeviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) >=
             sm90::ForwardSmemBytes(p.shape.head_dim);
#else
  (void)dtype, (void)p;
  return false;
#endif
}

// Whether the Hopper backward's kernels (sm90/bwd_*) run on this device
// for these inputs: built with sm_90a, a 9.x device with their shared
// memory, 16-bit, head dim a multiple of 8 up to 256, scale > 0
// (Sm90BackwardDeviceTakes); every variant up to head dim 128
// (Sm90BackwardKernelsServe), the plain 256 kernel (sm90/bwd256_kernel.cuh)
// above it (Sm90Backward256Serves).
bool Sm90BackwardDeviceTakes(ffi::DataType dtype, const AttentionParams& p) {
#ifdef JAX_FLASH_WITH_SM90
  return (dtype == ffi::DataType::F16 || dtype == ffi::DataType::BF16) && p.shape.head_dim % 8 == 0 &&
         sm90::PlainBackwardCoversHeadDim(p.shape.head_dim) && p.scale > 0 &&
         DeviceAttribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
         DeviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) >= sm90::BackwardSmemBytes(p.shape.head_dim);
#else
  (void)dtype, (void)p;
  return false;
#endif
}
bool Sm90BackwardKernelsServe(ffi::DataType dtype, const AttentionParams& p) {
  return p.shape.head_dim <= 128 && Sm90BackwardDeviceTakes(dtype, p);  // (sm90::BackwardCoversHeadDim's bound)
}
bool Sm90Backward256Serves(ffi::DataType dtype, const AttentionParams& p) {
  return p.shape.head_dim > 128 && Sm90BackwardDeviceTakes(dtype, p);
}

// sm90::BackwardTakesBias where the sm90 objects are built.
bool Sm90BiasVariantsTake(const AttentionParams& p) {
#ifdef JAX_FLASH_WITH_SM90
  return sm90::BackwardTakesBias(p);
#else
  (void)p;
  return false;
#endif
}

// Whether the Hopper backward (sm90/bwd_*) serves this call: as the forward
// (Sm90ForwardSupports), head dims up to 128 with the features its
// variants take, above 128 (up to 256, Sm90Backward256Serves) plain calls,
// the masks' features and the soft cap or dropout (a bias there stays on
// sm80's fused backward); the features its variants take (Sm90TakesFeatures: lengths,
// windows, position offsets, segment ids, the soft cap or dropout, and a
// boolean mask beside them; or a bias with the masks' features,
// BackwardTakesBias; a bias with a mask and dropout with the soft cap
// stay on sm80's), not deterministic (dQ is summed by
// atomic adds; deterministic plain calls: Sm90DeterministicScratch), with
// the float32 dQ accumulator. Decided after the features are decoded.
bool Sm90BackwardSupports(ffi::DataType dtype, const AttentionParams& p) {
  // A boolean mask: the feature variants read its bytes per S^T row
  // (sm90::FeatureStepMask; a key-only one, [B|1, N|1, 1, S], one byte per
  // key, any other one byte per pair; the soft cap's variant at head dim 64
  // key-only ones only, sm90::ReadsDenseStepMask), beside the features
  // they take otherwise.
  AttentionParams without_mask = p;
  if (p.features.mask && !p.features.bias &&
      (p.features.mask_stride.row == 0 || !(p.features.softcap > 0.0) || p.shape.head_dim > 64))
    without_mask.features.mask = nullptr;
  if (p.deterministic || p.dq_accum == nullptr) return false;
  // Above 128: plain calls, the masks' features (lengths, windows,
  // position offsets, segment ids, a boolean mask: Backward256Kernel's
  // kMasks) and those with the soft cap (kMasksSoftcap) or dropout
  // (kMasksDropout); a bias and dropout with the soft cap stay on sm80's
  // backward.
  if (Sm90Backward256Serves(dtype, p))
    return !p.features.bias && !(p.features.dropout_rate > 0.0 && p.features.softcap > 0.0);
  return Sm90BackwardKernelsServe(dtype, p) &&
         (Sm90TakesFeatures(without_mask) || (p.features.bias && Sm90BiasVariantsTake(p)));
}

// The deterministic Hopper backward's scratch (sm90::
// LaunchBackwardDeterministicDefault) where it serves this call, else
// null: a deterministic plain call (no attention features; the two-pass
// sm80 or generic backward keeps every other) that the sm90 kernels serve
// (Sm90BackwardKernelsServe, or above 128 Sm90Backward256Serves), with
// work to do (batch, heads and seqlen_q
// above 0), whose dq_accum result (jax_flash/_kernel_call.py's
// deterministic_scratch_floats) holds the float32 dQ accumulator, [batch,
// heads, seqlen_q, head_dim], then, from the next 16-byte boundary,
// sm90::DeterministicCounters int32 counters. Sets p->dq_accum; returns the
// counters. A smaller buffer (a module exported before session 21: an
// empty one) keeps the two-pass backward.
#ifdef JAX_FLASH_WITH_SM90
int* Sm90DeterministicScratch(ffi::DataType dtype, ffi::AnyBuffer& scratch, AttentionParams* p) {
  const AttentionShape& s = p->shape;
  if (p->features.Any() || !(Sm90BackwardKernelsServe(dtype, *p) || Sm90Backward256Serves(dtype, *p)) ||
      s.batch <= 0 || s.num_heads <= 0 ||
      s.seqlen_q <= 0 || scratch.element_type() != ffi::DataType::F32)
    return nullptr;
  const size_t accum_bytes = sizeof(float) * size_t(s.batch * s.num_heads * s.seqlen_q * s.head_dim);
  const size_t counters_at = (accum_bytes + 15) / 16 * 16;
  if (scratch.size_bytes() < counters_at + sizeof(int) * size_t(sm90::DeterministicCounters(s))) return nullptr;
  char* base = static_cast<char*>(scratch.untyped_data());
  p->dq_accum = reinterpret_cast<float*>(base);
  return reinterpret_cast<int*>(base + counters_at);
}
#endif

// Whether the Hopper bias-gradient pass (sm90::LaunchBiasGradient) serves
// this jax_flash_dbias call: the bias variants' calls, deterministic or
// not (the pass adds no dQ; a broadcast bias's sums are float32 atomics on
// every family).
bool Sm90BiasGradientSupports(ffi::DataType dtype, const AttentionParams& p) {
  return Sm90BackwardKernelsServe(dtype, p) && p.features.bias && Sm90BiasVariantsTake(p);
}

ffi::Error PoisonAsync(cudaStream_t stream, std::initializer_list<const ffi::AnyBuffer*> bufs) {
  for (const ffi::AnyBuffer* b : bufs) {
    // 0xff bytes are NaN in every float format we write.
    if (cudaMemsetAsync(b->untyped_data(), 0xff, b->size_bytes(), stream) != cudaSuccess)
      return ffi::Error::Internal("jax_flash: poisoning outputs failed");
  }
  return ffi::Error::Success();
}

// Decodes the feature operands (bias, masks, lengths, segments, window, soft
// cap, dropout). The sm80 forward and fused backward have feature variants;
// where the sm80 kernel at hand has none (the deterministic backward), the
// call runs the generic kernels instead.
ffi::Error DecodeFeaturesForFamily(const ffi::AnyBuffer& q, const FeatureOperands& o,
                                   bool sm80_has_features, int32_t* family, AttentionParams* p) {
  if (auto e = DecodeFeatures(q, o, p); e.failure()) return e;
  if (UsesFeatures(p->features) && !sm80_has_features) *family = int32_t(Family::kGeneric);
  return ffi::Error::Success();
}

// The split-KV decode path's scratch, as a handler sees it: null partials
// where the call needs none (one split at most), else the buffer's halves;
// false when the buffer is smaller than the call's splits need (Python sized
// it for other shapes): the call then stays on the training kernels.
bool DecodeScratch(const ffi::AnyBuffer& buf, int64_t sequences, int64_t seqlen_q, int64_t num_heads,
                   int64_t num_heads_k, int64_t seqlen_k, int64_t head_dim, float** partial_out,
                   float** partial_lse, int* max_splits) {
  const int64_t splits = decode::DecodeMaxSplits(sequences, seqlen_q, num_heads, num_heads_k, seqlen_k);
  const int64_t need = decode::DecodeScratchFloats(sequences, seqlen_q, num_heads, head_dim, splits);
  *max_splits = int(splits);
  *partial_out = *partial_lse = nullptr;
  if (need == 0) return true;
  if (buf.element_type() != ffi::DataType::F32 || int64_t(buf.element_count()) < need) return false;
  *partial_out = static_cast<float*>(buf.untyped_data());
  *partial_lse = *partial_out + decode::DecodePartialOutFloats(sequences, seqlen_q, num_heads, head_dim, splits);
  return true;
}

// Whether a call goes to the split-KV decode kernels (cuda/decode/launch.h's
// routing plan): 16-bit, a few queries over more keys, features they take,
// shared memory the device has; forced families keep their kernels.
bool DecodeApplies(ffi::DataType dtype, const AttentionParams& p, int32_t family) {
  const auto& s = p.shape;
  return Family(family) == Family::kAuto && (dtype == ffi::DataType::F16 || dtype == ffi::DataType::BF16) &&
         s.seqlen_q <= 64 && s.seqlen_q < s.seqlen_k && decode::Unsupported(p).empty() &&
         DeviceAttribute(cudaDevAttrComputeCapabilityMajor) >= 8 &&
         DeviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) >= decode::DecodeSmemBytes(s.head_dim);
}

ffi::Error ForwardImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                       ffi::AnyBuffer v, JAX_FLASH_FEATURE_PARAMS,
                       ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                       ffi::Result<ffi::AnyBuffer> decode_scratch) {
  int32_t family = implementation;
  AttentionParams p;
  if (auto e = BuildForwardParams(q, k, v, *out, *lse, scale, is_causal, &p); e.failure())
    return e;
  if (auto e = DecodeFeaturesForFamily(q, JAX_FLASH_FEATURE_OPERANDS, /*sm80_has_features=*/true,
                                       &family, &p);
      e.failure())
    return e;
  if (PoisonOutputsRequested()) {
    if (auto e = PoisonAsync(stream, {&*out, &*lse}); e.failure()) return e;
  }
  // Decoding: a few new queries over a long cache, split over the keys.
  if (DecodeApplies(q.element_type(), p, family)) {
    float *partial_out, *partial_lse;
    int max_splits;
    const auto& s = p.shape;
    if (DecodeScratch(*decode_scratch, s.batch, s.seqlen_q, s.num_heads, s.num_heads_k, s.seqlen_k,
                      s.head_dim, &partial_out, &partial_lse, &max_splits)) {
      // splits = 0: chosen from the work, capped at what the scratch holds.
      return DispatchTensorCores(q.element_type(), s, [&](auto element, auto head_dim) {
        return decode::LaunchForward<decltype(element), decltype(head_dim)::value>(
            p, max_splits == 1 ? 1 : 0, partial_out, partial_lse, stream);
      });
    }
  }
  // The sm80 forward folds the scale into one FFMA after the row maximum,
  // which needs scale > 0 (a non-positive scale runs the generic kernels).
  const bool sm80_ok = p.scale > 0 && Sm80Supports(q.element_type(), p.shape.head_dim,
                                                   sm80::ForwardSmemBytes(p.shape.head_dim));
  // The Hopper forward: plain calls and those with the features it takes
  // (Sm90ForwardTakesFeatures) on compute capability 9.x, 16-bit, head dims that are
  // a multiple of 8 (TMA's 16-byte strides), by default and when forced. The
  // backward stays on sm80 (same out and lse: the soft cap's tanh is the
  // sm80 forward's).
  const bool sm90_ok = Sm90ForwardSupports(q.element_type(), p);
  if (Family(family) == Family::kSm90 && !sm90_ok) {
    return ffi::Error::InvalidArgument(
        "jax_flash: implementation='sm90' needs a GPU of compute capability 9.x (a build with "
        "sm_90a), float16/bfloat16 inputs, a head dim that is a multiple of 8 (at most 256), a "
        "positive scale, and features it takes (lengths, segments, window, offsets and either the soft "
        "cap, dropout or a boolean mask contiguous along the keys, the mask also beside the soft cap, a "
        "key-only mask [B, N, 1, S] beside dropout; at head dims up to 128 also a bias contiguous along "
        "the keys instead)");
  }
#ifdef JAX_FLASH_WITH_SM90
  if ((Family(family) == Family::kAuto || Family(family) == Family::kSm90) && sm90_ok) {
    return DispatchTensorCores(q.element_type(), p.shape, [&](auto element, auto head_dim) {
      constexpr int kHeadDim = decltype(head_dim)::value;
      if (p.features.Any()) {
        // The mask policy's variants take their tiles from a counter
        // (fwd_kernel.cuh, for_each_taken_tile): the decode scratch's
        // first word (at least one float32, which these calls leave
        // unused), zeroed on the stream before the launch. (The soft
        // cap or dropout alone, kPlain*, take static tiles.)
        if (!p.features.OnlyTransforms() && decode_scratch->size_bytes() >= sizeof(int)) {
          p.tile_counter = static_cast<int*>(decode_scratch->untyped_data());
          if (cudaMemsetAsync(p.tile_counter, 0, sizeof(int), stream) != cudaSuccess)
            return std::string("jax_flash: zeroing the sm90 forward's tile counter failed: ") +
                   cudaGetErrorString(cudaGetLastError());
        }
        return sm90::LaunchForwardWithFeatures<decltype(element), kHeadDim>(p, stream);
      }
      return sm90::LaunchForward<decltype(element), kHeadDim>(p, stream);
    });
  }
#endif
  if (Family(family) == Family::kSm80 && !sm80_ok) {
    return ffi::Error::InvalidArgument(
        "jax_flash: implementation='sm80' needs float16/bfloat16 inputs, a positive scale, a "
        "head dim that is a multiple of 8 (at most 256) and a GPU of compute capability 8.0 or newer with enough "
        "shared memory for that head dim");
  }
  if (Family(family) != Family::kGeneric && sm80_ok) {
    return DispatchTensorCores(q.element_type(), p.shape, [&](auto element, auto head_dim) {
      return sm80::LaunchForward<decltype(element), decltype(head_dim)::value>(p, stream);
    });
  }
  return Dispatch(q.element_type(), p.shape, [&](auto element, auto head_dim) {
    return LaunchGenericForward<decltype(element), decltype(head_dim)::value>(p, stream);
  });
}

ffi::Error BackwardImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                        ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                        ffi::AnyBuffer dout, JAX_FLASH_FEATURE_PARAMS,
                        ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                        ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> delta,
                        ffi::Result<ffi::AnyBuffer> dq_accum) {
  int32_t family = implementation;
  AttentionParams p;
  if (auto e = BuildBackwardParams(q, k, v, out, lse, dout, *dq, *dk, *dv, *delta, scale,
                                   is_causal, &p);
      e.failure())
    return e;
  if (PoisonOutputsRequested()) {
    if (auto e = PoisonAsync(stream, {&*dq, &*dk, &*dv, &*delta}); e.failure()) return e;
  }
  // The fused backward adds dQ into a float32 accumulator that the caller
  // allocates (an extra, discarded result; empty when the Python side
  // foresees no use for it). Without one, or with deterministic=True, the
  // deterministic two-pass backward runs (deterministic plain calls on
  // Hopper: the sm90 deterministic backward, below, in the same result).
  const size_t accum_bytes = sizeof(float) * size_t(p.shape.batch * p.shape.num_heads *
                                                    p.shape.seqlen_q * p.shape.head_dim);
  p.deterministic = deterministic != 0 || dq_accum->element_type() != ffi::DataType::F32 ||
                    dq_accum->size_bytes() < accum_bytes;
  if (!p.deterministic) p.dq_accum = static_cast<float*>(dq_accum->untyped_data());
  // Only the fused sm80 backward has a feature variant.
  if (auto e = DecodeFeaturesForFamily(q, JAX_FLASH_FEATURE_OPERANDS,
                                       /*sm80_has_features=*/!p.deterministic, &family, &p);
      e.failure())
    return e;
  // The Hopper backward: non-deterministic 16-bit calls, plain or with the
  // features its variants take, on compute capability 9.x up to head dim
  // 128, and plain calls above that up to 256 (bwd256_kernel.cuh, since
  // session 31), by default and when forced. Plain: 1.10x / 1.13x of kLeanDq at 128
  // (session 18, H=128 T=4096 bf16, non-causal / causal; kLeanDq 1.34x /
  // 1.27x of sm80's), 474 / 329 TFLOP/s at 64 against sm80's ~312 / ~284.
  // Features (session 19): at 128 1.55-2.27x of sm80's, at 64 (128-query
  // steps) 1.95-3.19x. A bias (contiguous along the keys, without a boolean
  // mask, dropout or the soft cap): the bias variants (BackwardTakesBias).
  // Dropout (without the soft cap): kMasksDropout (kPlainDropout alone). A boolean mask: the
  // feature variants, one byte per key where it is key-only (key padding),
  // else one per pair. Other sm90-forced calls (dropout with the soft cap,
  // a bias with a mask) run sm80's backward,
  // as before: the forward's family does not bind the backward's.
  const bool sm90_ok = Sm90BackwardSupports(q.element_type(), p);
#ifdef JAX_FLASH_WITH_SM90
  // deterministic=True on plain calls (issue 21; session 21, at 256 since
  // session 31): the sm90 backward with dQ's adds in key block order
  // (DqOrder counters), by default and when sm90 is forced, where Python
  // gave it the scratch.
  if (deterministic != 0 && (Family(family) == Family::kAuto || Family(family) == Family::kSm90)) {
    if (int* counters = Sm90DeterministicScratch(q.element_type(), *dq_accum, &p)) {
      return DispatchTensorCores(q.element_type(), p.shape, [&](auto element, auto head_dim) -> std::string {
        return sm90::LaunchBackwardDeterministicDefault<decltype(element), decltype(head_dim)::value>(p, counters,
                                                                                                      stream);
      });
    }
  }
  if ((Family(family) == Family::kAuto || Family(family) == Family::kSm90) && sm90_ok) {
    return DispatchTensorCores(q.element_type(), p.shape, [&](auto element, auto head_dim) -> std::string {
      if constexpr (decltype(head_dim)::value <= 128) {
        if (p.features.bias)
          return sm90::LaunchBackwardWithBias<decltype(element), decltype(head_dim)::value>(p, stream);
        if (p.features.Any())
          return sm90::LaunchBackwardWithFeatures<decltype(element), decltype(head_dim)::value>(p, stream);
        return sm90::LaunchBackward<decltype(element), decltype(head_dim)::value>(p, stream);
      } else {
        // (Sm90BackwardSupports takes plain calls, the masks' features, the soft cap and dropout here.)
        if (p.features.Any()) return sm90::LaunchBackwardWithFeatures<decltype(element), 256>(p, stream);
        return sm90::LaunchBackward<decltype(element), 256>(p, stream);
      }
    });
  }
#else
  (void)sm90_ok;
#endif
  // The mma.sync backward covers head dims up to 128, and 256 when fused
  // (deterministic at 256 stays generic).
  if (Family(family) != Family::kGeneric && (p.shape.head_dim <= 128 || !p.deterministic) &&
      Sm80Supports(q.element_type(), p.shape.head_dim,
                   sm80::BackwardSmemBytes(p.shape.head_dim, p.deterministic,
                                           DeviceAttribute(cudaDevAttrComputeCapabilityMajor)))) {
    return DispatchTensorCores(q.element_type(), p.shape, [&](auto element, auto head_dim) {
      return sm80::LaunchBackward<decltype(element), decltype(head_dim)::value>(p, stream);
    });
  }
  return Dispatch(q.element_type(), p.shape, [&](auto element, auto head_dim) {
    return LaunchGenericBackward<decltype(element), decltype(head_dim)::value>(p, stream);
  });
}

// The bias gradient, a call of its own so that XLA drops it when nobody
// uses dbias (a bias that is not trained: masks as biases, ALiBi). On the
// tensor cores where the sm80 fused backward serves the shape (its feature
// kernel in a dbias-only mode: S, P, dP and dS per tile, no dV / dK / dQ),
// else the generic kernels. (Returning dbias from the backward call instead
// would save the recomputation of S and dP when dbias is used, but the
// backward would then write a bias-sized gradient whenever a bias is
// present, used or not: XLA cannot drop one result of a custom call.)
// Where the bias has the full [..., N, T, S] shape each element has one
// writer and dS is stored in the bias's type; where it is broadcast, dS is
// summed by float32 atomics: into dbias itself for a float32 bias, else into
// the dbias_accum scratch, rounded into dbias after.
ffi::Error BiasGradientImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                            ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                            ffi::AnyBuffer dout, JAX_FLASH_FEATURE_PARAMS,
                            ffi::Result<ffi::AnyBuffer> dbias, ffi::Result<ffi::AnyBuffer> delta,
                            ffi::Result<ffi::AnyBuffer> dbias_accum) {
  (void)deterministic;  // one path: atomics where the bias is broadcast
  int32_t family = implementation;
  AttentionParams p;
  // dq/dk/dv slots are not written by this target: pass dout in their place
  // for the shape checks only.
  if (auto e = BuildBackwardParams(q, k, v, out, lse, dout, dout, k, v, *delta, scale, is_causal,
                                   &p);
      e.failure())
    return e;
  if (auto e = DecodeFeatures(q, JAX_FLASH_FEATURE_OPERANDS, &p); e.failure()) return e;
  if (!(features & kHasBias))
    return ffi::Error::InvalidArgument("jax_flash: the bias gradient needs a bias");
  if (auto e = ExpectSameShape("dbias", *dbias, bias.dimensions()); e.failure()) return e;
  if (dbias->element_type() != bias.element_type())
    return ffi::Error::InvalidArgument("jax_flash: dbias dtype must match the bias");
  p.dq = p.dk = p.dv = nullptr;  // null dk: the sm80 kernel's dbias-only mode
  const AttentionShape& s = p.shape;
  const int64_t elements = ElementCount(bias);
  const bool full = elements == s.batch * s.num_heads * s.seqlen_q * s.seqlen_k;
  const bool sums_in_scratch = !full && p.features.bias_type != BiasType::kAccum;
  if (full) {
    p.features.dbias_direct = dbias->untyped_data();
  } else if (!sums_in_scratch) {
    p.features.dbias = static_cast<float*>(dbias->untyped_data());
  } else {
    if (dbias_accum->element_type() != ffi::DataType::F32 || ElementCount(*dbias_accum) < elements)
      return ffi::Error::InvalidArgument(
          "jax_flash: a broadcast 16-bit bias needs a float32 dbias_accum of the bias's shape");
    p.features.dbias = static_cast<float*>(dbias_accum->untyped_data());
  }
  if (PoisonOutputsRequested()) {
    if (auto e = PoisonAsync(stream, {&*dbias, &*delta}); e.failure()) return e;
  }
  // Zeroed: pairs that no block visits (hidden blocks) add nothing.
  void* target = sums_in_scratch ? static_cast<void*>(p.features.dbias) : dbias->untyped_data();
  const size_t target_bytes = sums_in_scratch ? sizeof(float) * size_t(elements) : dbias->size_bytes();
  if (cudaMemsetAsync(target, 0, target_bytes, stream) != cudaSuccess)
    return ffi::Error::Internal("jax_flash: clearing the bias gradient failed");

  const ffi::DataType dtype = q.element_type();
  const bool sm80_ok =
      Family(family) != Family::kGeneric &&
      Sm80Supports(dtype, s.head_dim,
                   sm80::BackwardSmemBytes(s.head_dim, false, DeviceAttribute(cudaDevAttrComputeCapabilityMajor)));
  // The Hopper pass (BiasGradientKernel: S^T with the bias, dP^T, dS^T per
  // step, 2 of the backward's 5 products) where its backward's bias
  // variants take the call (Sm90BiasGradientSupports), by default and when
  // sm90 is forced.
  const bool sm90_ok = (Family(family) == Family::kAuto || Family(family) == Family::kSm90) &&
                       Sm90BiasGradientSupports(dtype, p);
  ffi::Error launched = ffi::Error::Success();
#ifdef JAX_FLASH_WITH_SM90
  if (sm90_ok) {
    launched = DispatchTensorCores(dtype, s, [&](auto element, auto head_dim) -> std::string {
      if constexpr (decltype(head_dim)::value <= 128)
        return sm90::LaunchBiasGradient<decltype(element), decltype(head_dim)::value>(p, stream);
      else
        return "jax_flash: the sm90 bias gradient has no head dim 256 kernel";  // Sm90BackwardSupports excludes it
    });
  } else
#else
  (void)sm90_ok;
#endif
  launched = sm80_ok
      ? DispatchTensorCores(dtype, s, [&](auto element, auto head_dim) {
          return sm80::LaunchBiasGradient<decltype(element), decltype(head_dim)::value>(p, stream);
        })
      : Dispatch(dtype, s, [&](auto element, auto head_dim) {
          return LaunchGenericBiasGradient<decltype(element), decltype(head_dim)::value>(p, stream);
        });
  if (launched.failure() || !sums_in_scratch) return launched;
  const std::string err = p.features.bias_type == BiasType::kFloat16
                              ? LaunchDbiasConvert<__half>(p.features.dbias, dbias->untyped_data(), elements, stream)
                              : LaunchDbiasConvert<__nv_bfloat16>(p.features.dbias, dbias->untyped_data(), elements,
                                                                  stream);
  if (!err.empty()) return InternalWithShape(err, s);
  return ffi::Error::Success();
}

// Paged attention on CUDA: the split-KV decode kernels reading K/V through
// the block tables (16-bit; jax_flash/paged.py sends float32 through its
// gather instead, so another dtype here is an error, not a fallback).
ffi::Error PagedForwardImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k_cache,
                            ffi::AnyBuffer v_cache, ffi::AnyBuffer block_tables, ffi::AnyBuffer seq_lengths,
                            double scale, double softcap, int64_t window_left,
                            ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                            ffi::Result<ffi::AnyBuffer> decode_scratch) {
  PagedParams p;
  if (auto e = BuildPagedParams(q, k_cache, v_cache, block_tables, seq_lengths, *out, *lse, scale, softcap,
                                window_left, &p);
      e.failure())
    return e;
  if (PoisonOutputsRequested()) {
    if (auto e = PoisonAsync(stream, {&*out, &*lse}); e.failure()) return e;
  }
  const PagedShape& s = p.shape;
  if (q.element_type() != ffi::DataType::F16 && q.element_type() != ffi::DataType::BF16)
    return ffi::Error::InvalidArgument("jax_flash: the CUDA paged forward takes float16/bfloat16 inputs");
  if (auto why = decode::UnsupportedPaged(p); !why.empty())
    return ffi::Error::InvalidArgument("jax_flash: paged attention on this GPU: " + why);
  if (DeviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) < decode::DecodeSmemBytes(s.head_dim))
    return ffi::Error::InvalidArgument("jax_flash: paged attention at head dim " + std::to_string(s.head_dim) +
                                       " needs more shared memory per block than this GPU has");
  float *partial_out, *partial_lse;
  int max_splits;
  if (!DecodeScratch(*decode_scratch, s.outer * s.batch, s.seqlen_q, s.num_heads, s.num_heads_k,
                     s.max_seqlen(), s.head_dim, &partial_out, &partial_lse, &max_splits))
    return ffi::Error::InvalidArgument("jax_flash: paged attention's decode scratch is too small for its shapes");
  return DispatchTensorCores(q.element_type(), s.AsAttention(), [&](auto element, auto head_dim) {
    return decode::LaunchPagedForward<decltype(element), decltype(head_dim)::value>(
        p, max_splits == 1 ? 1 : 0, partial_out, partial_lse, stream);
  });
}

}  // namespace
}  // namespace jax_flash::cuda

// Command-buffer (CUDA graph) compatible: the handlers only launch kernels
// and memsets on XLA's stream, use no memory but their buffers (scratch is an
// extra result), never synchronize or query the stream, and launch the same
// work for the same shapes and attributes (the host-side queries, occupancy,
// function attributes and TMA descriptors, are not stream work). XLA then
// captures the calls into its command buffers (tests/test_command_buffers.py
// checks the results are bitwise those of plain stream execution).
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxFlashForwardCuda, jax_flash::cuda::ForwardImpl,
    JAX_FLASH_FWD_BINDING(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
    {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxFlashBackwardCuda, jax_flash::cuda::BackwardImpl,
    JAX_FLASH_BWD_BINDING(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
    {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxFlashBiasGradientCuda, jax_flash::cuda::BiasGradientImpl,
    JAX_FLASH_DBIAS_BINDING(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
    {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxFlashPagedForwardCuda, jax_flash::cuda::PagedForwardImpl,
    JAX_FLASH_PAGED_FWD_BINDING(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
    {xla::ffi::Traits::kCmdBufferCompatible});
