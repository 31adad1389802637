// The nanobind extension jax_flash._ffi: hands the FFI handlers to Python as
// capsules (registered with XLA by jax_flash/_registration.py) and says what was built.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common/test_hooks.h"
#include "cpu/handlers.h"
#ifdef JAX_FLASH_WITH_CUDA
#include "cuda/handlers.h"
#endif

namespace nb = nanobind;

// The FFI target names carry the version of the operand/attribute layout
// (ffi/common/ffi_bindings.h). Bump it whenever that layout changes (an operand
// added, removed or reordered; an attribute renamed or retyped; a result
// changed), together with ABI_VERSION in jax_flash/_registration.py: a module
// exported with jax.export against another layout then fails to compile with
// "no registered implementation for jax_flash_fwd_v<N>" instead of running
// with misread operands. "v1" is the unversioned names of earlier releases.
#define JAX_FLASH_ABI "v7"

namespace {

template <typename Fn>
nb::capsule Capsule(Fn* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, Fn, XLA_FFI_CallFrame*>,
                "an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_ffi, m) {
  m.def("cpu_targets", [] {
    nb::dict d;
    d["jax_flash_fwd_" JAX_FLASH_ABI] = Capsule(JaxFlashForwardCpu);
    d["jax_flash_bwd_" JAX_FLASH_ABI] = Capsule(JaxFlashBackwardCpu);
    d["jax_flash_dbias_" JAX_FLASH_ABI] = Capsule(JaxFlashBiasGradientCpu);
    d["jax_flash_paged_fwd_" JAX_FLASH_ABI] = Capsule(JaxFlashPagedForwardCpu);
    return d;
  });
  m.def("cuda_targets", [] {
    nb::dict d;
#ifdef JAX_FLASH_WITH_CUDA
    d["jax_flash_fwd_" JAX_FLASH_ABI] = Capsule(JaxFlashForwardCuda);
    d["jax_flash_bwd_" JAX_FLASH_ABI] = Capsule(JaxFlashBackwardCuda);
    d["jax_flash_dbias_" JAX_FLASH_ABI] = Capsule(JaxFlashBiasGradientCuda);
    d["jax_flash_paged_fwd_" JAX_FLASH_ABI] = Capsule(JaxFlashPagedForwardCuda);
#endif
    return d;
  });
  // Test hook (common/test_hooks.h): the next `count` kernel launches report
  // a failure through their real error path (tests/test_robustness.py).
  m.def("inject_launch_failures", [](int count) { jax_flash::InjectLaunchFailures(count); }, nb::arg("count"));
  // Test hook: record the sm90 kernel variants launched (on: from empty),
  // and take the names recorded so far (tests/test_bias16.py).
  m.def("record_kernels", [](bool on) { jax_flash::RecordKernels(on); }, nb::arg("on"));
  m.def("recorded_kernels", [] { return jax_flash::TakeRecordedKernels(); });
  m.def("build_info", [] {
    nb::dict d;
#ifdef JAX_FLASH_WITH_CUDA
    d["cuda"] = true;
    d["cuda_archs"] = std::string(JAX_FLASH_CUDA_ARCHS);
    d["cuda_version"] = std::string(JAX_FLASH_CUDA_VERSION);
    // The CUDA kernels read a 16-bit bias as such and write dbias in its
    // dtype (jax_flash/_kernel_call.py then skips its float32 up-cast).
    d["cuda_bias_16bit"] = true;
#ifdef JAX_FLASH_WITH_SM90
    // The deterministic sm90 backward is built: deterministic plain calls
    // get its scratch (the dQ accumulator and counters, _kernel_call.py).
    d["cuda_sm90_deterministic_backward"] = true;
#endif
#else
    d["cuda"] = false;
    d["cuda_archs"] = std::string();
    d["cuda_version"] = std::string();
#endif
    d["jax_headers_version"] = std::string(JAX_FLASH_JAX_VERSION);
    d["cpu_native"] = bool(JAX_FLASH_CPU_NATIVE);
    return d;
  });
}
