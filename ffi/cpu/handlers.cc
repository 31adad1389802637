// XLA FFI handlers of the CPU platform: decode buffers, dispatch on dtype,
// run the blocked CPU kernels.
#include "cpu/handlers.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <limits>

#include "common/ffi_bindings.h"
#include "common/feature_decode.h"
#include "common/ffi_decode.h"
#include "common/test_hooks.h"
#include "cpu/attention_cpu.h"
#include "cpu/element.h"
#include "common/paged_decode.h"
#include "cpu/paged_cpu.h"

namespace jax_flash::cpu {
namespace {

template <typename Fn>
ffi::Error DispatchDtype(ffi::DataType dtype, Fn&& fn) {
  switch (dtype) {
    case ffi::DataType::F16: fn(Float16{}); break;
    case ffi::DataType::BF16: fn(BFloat16{}); break;
    case ffi::DataType::F32: fn(float{}); break;
    case ffi::DataType::F64: fn(double{}); break;
    default:
      return ffi::Error::InvalidArgument(
          "jax_flash: unsupported dtype; expected float16, bfloat16, float32 or float64");
  }
  return ffi::Error::Success();
}

void Poison(const ffi::AnyBuffer& buf) {
  // 0xff bytes are NaN in every float format we write.
  std::memset(buf.untyped_data(), 0xff, buf.size_bytes());
}

// Kernels may throw std::bad_alloc (scratch vectors): turn it into an error
// naming the call's shape instead of letting it cross the C API. A test's
// injected failure (common/test_hooks.h) takes the same road.
template <typename Fn>
ffi::Error Guarded(const AttentionShape& shape, Fn&& fn) {
  if (TakeInjectedLaunchFailure())
    return InternalWithShape("jax_flash CPU kernel failed: an injected failure (test hook)", shape);
  try {
    return fn();
  } catch (const std::exception& e) {
    return InternalWithShape(std::string("jax_flash CPU kernel failed: ") + e.what(), shape);
  }
}

ffi::Error ForwardImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                       JAX_FLASH_FEATURE_PARAMS, ffi::Result<ffi::AnyBuffer> out,
                       ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> decode_scratch) {
  (void)implementation;  // one CPU kernel family
  (void)decode_scratch;  // the CUDA decode path's
  AttentionParams p;
  if (auto e = BuildForwardParams(q, k, v, *out, *lse, scale, is_causal, &p); e.failure())
    return e;
  if (auto e = DecodeFeatures(q, JAX_FLASH_FEATURE_OPERANDS, &p); e.failure()) return e;
  if (PoisonOutputsRequested()) {
    Poison(*out);
    Poison(*lse);
  }
  return Guarded(p.shape, [&] {
    return DispatchDtype(q.element_type(), [&](auto element) {
      AttentionForward<decltype(element)>(p);
    });
  });
}

ffi::Error BackwardImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                        ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer dout,
                        JAX_FLASH_FEATURE_PARAMS, ffi::Result<ffi::AnyBuffer> dq,
                        ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                        ffi::Result<ffi::AnyBuffer> delta, ffi::Result<ffi::AnyBuffer>) {
  // The CPU backward is always deterministic and needs no dQ accumulator.
  (void)implementation, (void)deterministic;
  AttentionParams p;
  if (auto e = BuildBackwardParams(q, k, v, out, lse, dout, *dq, *dk, *dv, *delta,
                                   scale, is_causal, &p);
      e.failure())
    return e;
  if (auto e = DecodeFeatures(q, JAX_FLASH_FEATURE_OPERANDS, &p); e.failure()) return e;
  if (PoisonOutputsRequested()) {
    for (auto* b : {&*dq, &*dk, &*dv, &*delta}) Poison(*b);
  }
  return Guarded(p.shape, [&] {
    return DispatchDtype(q.element_type(), [&](auto element) {
      AttentionBackward<decltype(element)>(p);
    });
  });
}

ffi::Error BiasGradientImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                            ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer dout,
                            JAX_FLASH_FEATURE_PARAMS, ffi::Result<ffi::AnyBuffer> dbias,
                            ffi::Result<ffi::AnyBuffer> delta, ffi::Result<ffi::AnyBuffer> dbias_accum) {
  (void)implementation;
  (void)dbias_accum;  // the CUDA kernels' float32 sums; the CPU sums per task
  AttentionParams p;
  // dq/dk/dv slots are not written by this target: pass dout in their place
  // for the shape checks only.
  if (auto e = BuildBackwardParams(q, k, v, out, lse, dout, dout, k, v, *delta, scale,
                                   is_causal, &p);
      e.failure())
    return e;
  BiasShape bias_shape;
  if (auto e = DecodeFeatures(q, JAX_FLASH_FEATURE_OPERANDS, &p, &bias_shape.rows, &bias_shape.cols);
      e.failure())
    return e;
  if (!(features & kHasBias))
    return ffi::Error::InvalidArgument("jax_flash: the bias gradient needs a bias");
  if (auto e = ExpectSameShape("dbias", *dbias, bias.dimensions()); e.failure()) return e;
  if (dbias->element_type() != bias.element_type())
    return ffi::Error::InvalidArgument("jax_flash: dbias dtype must match the bias");
  bias_shape.num_elements = ElementCount(bias);
  p.dq = p.dk = p.dv = nullptr;
  if (PoisonOutputsRequested()) {
    Poison(*dbias);
    Poison(*delta);
  }
  return Guarded(p.shape, [&] {
    return DispatchDtype(q.element_type(), [&](auto element) {
      AttentionBiasGradient<decltype(element)>(p, bias_shape, dbias->untyped_data());
    });
  });
}

ffi::Error PagedForwardImpl(ffi::AnyBuffer q, ffi::AnyBuffer k_cache, ffi::AnyBuffer v_cache,
                            ffi::AnyBuffer block_tables, ffi::AnyBuffer seq_lengths, double scale,
                            double softcap, int64_t window_left, ffi::Result<ffi::AnyBuffer> out,
                            ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> decode_scratch) {
  (void)decode_scratch;  // the CUDA decode path's
  PagedParams p;
  if (auto e = BuildPagedParams(q, k_cache, v_cache, block_tables, seq_lengths, *out, *lse, scale,
                                softcap, window_left, &p);
      e.failure())
    return e;
  if (PoisonOutputsRequested()) {
    Poison(*out);
    Poison(*lse);
  }
  return Guarded(p.shape.AsAttention(), [&] {
    return DispatchDtype(q.element_type(), [&](auto element) {
      PagedAttentionForward<decltype(element)>(p);
    });
  });
}

}  // namespace
}  // namespace jax_flash::cpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxFlashForwardCpu, jax_flash::cpu::ForwardImpl,
                              JAX_FLASH_FWD_BINDING(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxFlashBackwardCpu, jax_flash::cpu::BackwardImpl,
                              JAX_FLASH_BWD_BINDING(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxFlashBiasGradientCpu, jax_flash::cpu::BiasGradientImpl,
                              JAX_FLASH_DBIAS_BINDING(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxFlashPagedForwardCpu, jax_flash::cpu::PagedForwardImpl,
                              JAX_FLASH_PAGED_FWD_BINDING(xla::ffi::Ffi::Bind()));
