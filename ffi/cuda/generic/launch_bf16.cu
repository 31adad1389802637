#include "cuda/generic/launch.cuh"

namespace jax_flash::cuda {
JAX_FLASH_INSTANTIATE_GENERIC(__nv_bfloat16)
}  // namespace jax_flash::cuda
