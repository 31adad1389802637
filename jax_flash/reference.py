"""Plain ``jax.numpy`` attention with jax_flash's semantics.

Materializes the ``[T, S]`` logits: for tests, debugging and small inputs.
Computes in the inputs' dtype promoted to at least float32 (float64 inputs
stay float64, which the tests use as ground truth).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def attention(query, key, value, *, scale=None, is_causal=False, return_residual=False):
    """Reference attention on ``[B, T, N, H]`` / ``[B, S, K, H]`` inputs.

    Rows with no visible key give zeros and a logsumexp of ``-inf`` (jax_flash's
    contract). Returns ``out`` (input dtype) or ``(out, lse)`` with ``lse``
    ``[B, N, T]`` in the compute dtype.
    """
    b, t, n, h = query.shape
    s, k = key.shape[1], key.shape[2]
    compute = jnp.promote_types(query.dtype, jnp.float32)
    scale = 1.0 / math.sqrt(h) if scale is None else scale
    q = query.astype(compute).reshape(b, t, k, n // k, h)
    logits = jnp.einsum("btkgh,bskh->bkgts", q, key.astype(compute)) * scale
    if is_causal:
        visible = jnp.arange(s)[None, :] <= jnp.arange(t)[:, None]
        logits = jnp.where(visible, logits, -jnp.inf)
    lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    finite = jnp.isfinite(lse)
    probs = jnp.where(finite, jnp.exp(logits - jnp.where(finite, lse, 0.0)), 0.0)
    out = jnp.einsum("bkgts,bskh->btkgh", probs, value.astype(compute))
    out = out.reshape(b, t, n, h).astype(query.dtype)
    if return_residual:
        return out, lse[..., 0].reshape(b, n, t)
    return out
