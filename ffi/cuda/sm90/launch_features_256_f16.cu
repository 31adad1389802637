#include "cuda/sm90/launch.cuh"

namespace jax_flash::cuda::sm90 {
JAX_FLASH_INSTANTIATE_SM90_FEATURES_256(__half)
}  // namespace jax_flash::cuda::sm90
