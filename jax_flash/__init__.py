"""jax-flash: FlashAttention for JAX (CUDA and CPU kernels as XLA FFI calls)."""

from jax_flash._registration import build_info
from jax_flash.attention import attention

__version__ = "0.1.0"
__all__ = ["attention", "build_info", "__version__"]
