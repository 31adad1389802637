#include "cuda/sm80/launch.cuh"

namespace jax_flash::cuda::sm80 {
JAX_FLASH_INSTANTIATE_SM80(__nv_bfloat16)
}  // namespace jax_flash::cuda::sm80
