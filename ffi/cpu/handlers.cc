// XLA FFI handlers of the CPU platform: decode buffers, dispatch on dtype,
// run the blocked CPU kernels.
#include "cpu/handlers.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <limits>

#include "common/ffi_decode.h"
#include "cpu/attention_cpu.h"
#include "cpu/element.h"

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
// instead of letting it cross the C API.
template <typename Fn>
ffi::Error Guarded(Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jax_flash CPU kernel failed: ") + e.what());
  }
}

ffi::Error ForwardImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                       double scale, int32_t is_causal, int32_t /*implementation*/,
                       ffi::Result<ffi::AnyBuffer> out,
                       ffi::Result<ffi::AnyBuffer> lse) {
  AttentionParams p;
  if (auto e = BuildForwardParams(q, k, v, *out, *lse, scale, is_causal, &p); e.failure())
    return e;
  if (PoisonOutputsRequested()) {
    Poison(*out);
    Poison(*lse);
  }
  return Guarded([&] {
    return DispatchDtype(q.element_type(), [&](auto element) {
      AttentionForward<decltype(element)>(p);
    });
  });
}

ffi::Error BackwardImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                        ffi::AnyBuffer out, ffi::AnyBuffer lse,
                        ffi::AnyBuffer dout, double scale, int32_t is_causal,
                        int32_t /*implementation: one CPU kernel family*/,
                        ffi::Result<ffi::AnyBuffer> dq,
                        ffi::Result<ffi::AnyBuffer> dk,
                        ffi::Result<ffi::AnyBuffer> dv,
                        ffi::Result<ffi::AnyBuffer> delta) {
  AttentionParams p;
  if (auto e = BuildBackwardParams(q, k, v, out, lse, dout, *dq, *dk, *dv, *delta,
                                   scale, is_causal, &p);
      e.failure())
    return e;
  if (PoisonOutputsRequested()) {
    for (auto* b : {&*dq, &*dk, &*dv, &*delta}) Poison(*b);
  }
  return Guarded([&] {
    return DispatchDtype(q.element_type(), [&](auto element) {
      AttentionBackward<decltype(element)>(p);
    });
  });
}

}  // namespace
}  // namespace jax_flash::cpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxFlashForwardCpu, jax_flash::cpu::ForwardImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()  // q
                                  .Arg<xla::ffi::AnyBuffer>()  // k
                                  .Arg<xla::ffi::AnyBuffer>()  // v
                                  .Attr<double>("scale")
                                  .Attr<int32_t>("is_causal")
                                  .Attr<int32_t>("implementation")
                                  .Ret<xla::ffi::AnyBuffer>()   // out
                                  .Ret<xla::ffi::AnyBuffer>());  // lse

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxFlashBackwardCpu, jax_flash::cpu::BackwardImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()  // q
                                  .Arg<xla::ffi::AnyBuffer>()  // k
                                  .Arg<xla::ffi::AnyBuffer>()  // v
                                  .Arg<xla::ffi::AnyBuffer>()  // out
                                  .Arg<xla::ffi::AnyBuffer>()  // lse
                                  .Arg<xla::ffi::AnyBuffer>()  // dout
                                  .Attr<double>("scale")
                                  .Attr<int32_t>("is_causal")
                                  .Attr<int32_t>("implementation")
                                  .Ret<xla::ffi::AnyBuffer>()   // dq
                                  .Ret<xla::ffi::AnyBuffer>()   // dk
                                  .Ret<xla::ffi::AnyBuffer>()   // dv
                                  .Ret<xla::ffi::AnyBuffer>());  // delta (scratch)
