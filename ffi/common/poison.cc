#include <cstdlib>
#include <cstring>

#include "common/ffi_decode.h"

namespace jax_flash {

bool PoisonOutputsRequested() {
  static const bool requested = [] {
    const char* v = std::getenv("JAX_FLASH_POISON_OUTPUTS");
    return v != nullptr && std::strcmp(v, "") != 0 && std::strcmp(v, "0") != 0;
  }();
  return requested;
}

}  // namespace jax_flash
