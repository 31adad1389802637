"""jax-flash: FlashAttention for JAX (CUDA and CPU kernels as XLA FFI calls)."""

from jax_flash import ring
from jax_flash._registration import build_info, export_safety_checks
from jax_flash.attention import attention
from jax_flash.paged import paged_attention
from jax_flash.ring import ring_attention

__version__ = "0.1.0"
__all__ = ["attention", "paged_attention", "ring_attention", "ring", "build_info", "export_safety_checks", "__version__"]
