// The deterministic sm90 backward (LaunchBackwardDeterministicDefault) in
// its own object, so that CI's two cores compile it beside the others.
#include "cuda/sm90/bwd_launch.cuh"

namespace jax_flash::cuda::sm90 {
JAX_FLASH_INSTANTIATE_SM90_BWD_DETERMINISTIC(__nv_bfloat16)
}  // namespace jax_flash::cuda::sm90
