#include "cuda/generic/launch.cuh"

namespace jax_flash::cuda {
JAX_FLASH_INSTANTIATE_GENERIC(__half)
}  // namespace jax_flash::cuda
