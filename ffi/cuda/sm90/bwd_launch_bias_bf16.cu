#include "cuda/sm90/bwd_launch.cuh"

namespace jax_flash::cuda::sm90 {

bool BackwardTakesBias(const AttentionParams& p) {
  const AttentionFeatures& f = p.features;
  return f.bias && !f.mask && !(f.dropout_rate > 0.0) && !(f.softcap > 0.0) && f.bias_stride.col == 1 &&
         BiasRowsFit(p);
}

JAX_FLASH_INSTANTIATE_SM90_BWD_BIAS(__nv_bfloat16)
}  // namespace jax_flash::cuda::sm90
