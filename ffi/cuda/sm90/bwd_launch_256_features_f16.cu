#include "cuda/sm90/bwd_launch.cuh"

namespace jax_flash::cuda::sm90 {
JAX_FLASH_INSTANTIATE_SM90_BWD_256_FEATURES(__half)
}  // namespace jax_flash::cuda::sm90
