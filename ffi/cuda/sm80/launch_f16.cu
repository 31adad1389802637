#include "cuda/sm80/launch.cuh"

namespace jax_flash::cuda::sm80 {
JAX_FLASH_INSTANTIATE_SM80(__half)
}  // namespace jax_flash::cuda::sm80
