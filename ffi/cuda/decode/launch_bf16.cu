// The decode kernels for bf16: one split-forward and one combine kernel per
// head dim, serving the contiguous and the paged call alike.
#include "cuda/decode/launch.cuh"

namespace jax_flash::cuda::decode {
JAX_FLASH_INSTANTIATE_DECODE(__nv_bfloat16, 64)
JAX_FLASH_INSTANTIATE_DECODE(__nv_bfloat16, 128)
JAX_FLASH_INSTANTIATE_DECODE(__nv_bfloat16, 256)
}  // namespace jax_flash::cuda::decode
