"""``jax_flash.attention``: argument checks, the custom VJP, the FFI calls."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash import _registration

MAX_HEAD_DIM = 256
# `implementation` values and the FFI attribute each maps to.
IMPLEMENTATIONS = {None: 0, "generic": 1, "sm80": 2}
SUPPORTED_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)

# Arguments of jax.nn.dot_product_attention that later work implements; until
# then passing them raises instead of silently computing something else.
_NOT_YET = ("bias", "mask", "query_seq_lengths", "key_value_seq_lengths", "local_window_size")


def attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths: jax.Array | None = None,
    key_value_seq_lengths: jax.Array | None = None,
    local_window_size: int | tuple[int, int] | None = None,
    return_residual: bool = False,
    implementation: str | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Fused scaled dot-product attention, a drop-in for ``jax.nn.dot_product_attention``.

    Computes ``softmax(scale * query @ key^T) @ value`` per head without
    materializing the ``[T, S]`` logits, on the CPU (C++ kernels) or an NVIDIA
    GPU (CUDA kernels), with a fused backward pass.

    Letters as in ``jax.nn.dot_product_attention``: B batch, T query length,
    S key/value length, N query heads, K key/value heads (K divides N: GQA/MQA),
    H head dim (1 to 256).

    Arguments:
      query: ``[B, T, N, H]`` or ``[T, N, H]``; float16, bfloat16, float32 or
        float64 (float64 on the CPU only).
      key: ``[B, S, K, H]`` or ``[S, K, H]``, the query's dtype.
      value: the key's shape and dtype.
      bias, mask, query_seq_lengths, key_value_seq_lengths, local_window_size:
        accepted for signature compatibility; not implemented yet (raise
        ``NotImplementedError`` when given).
      scale: multiplies the logits; default ``1 / sqrt(H)``. A Python or NumPy
        number (it is compiled into the kernel call).
      is_causal: top-left aligned causal mask: query ``i`` attends keys ``j <= i``.
      return_residual: also return the natural-log logsumexp of the scaled
        logits, shape ``[B, T, N]`` (or ``[T, N]``) in the query's dtype, as jax
        does. It carries no gradient.
      implementation: which CUDA kernel family runs the forward: ``None``
        picks the fastest that supports the inputs, ``"sm80"`` forces the
        mma.sync tensor-core kernels (float16/bfloat16, head dim a multiple of
        8, compute capability >= 8.0; an error otherwise), ``"generic"`` the
        exact SIMT kernels that take every dtype and head dim. The mma.sync
        backward covers head dims up to 128; above that the backward runs the
        generic kernels. Ignored on the CPU.

    Returns:
      The attention output, shaped and typed like ``query``; with
      ``return_residual=True`` a tuple ``(output, logsumexp)``.
    """
    for name in _NOT_YET:
        if locals()[name] is not None:
            raise NotImplementedError(f"jax_flash.attention: `{name}` is not supported yet")
    query, key, value = (jnp.asarray(x) for x in (query, key, value))
    _check_inputs(query, key, value)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a Python bool, got {type(is_causal).__name__}")
    scale = _static_scale(scale, query.shape[-1])
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be one of {sorted(IMPLEMENTATIONS, key=str)}; got {implementation!r}"
        )

    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = query[None], key[None], value[None]
    out, lse = _flash_attention(
        query, key, value, scale, bool(is_causal), IMPLEMENTATIONS[implementation]
    )
    if unbatched:
        out, lse = out[0], lse[0]
    if not return_residual:
        return out
    # lse is [..., N, T] float32; jax returns [..., T, N] in the input dtype.
    residual = jax.lax.stop_gradient(jnp.swapaxes(lse, -1, -2).astype(query.dtype))
    return out, residual


def _check_inputs(query: jax.Array, key: jax.Array, value: jax.Array) -> None:
    if query.ndim not in (3, 4):
        raise ValueError(
            f"query must be [B, T, N, H] or [T, N, H]; got shape {query.shape} ({query.ndim}-D)"
        )
    for name, x in (("key", key), ("value", value)):
        if x.ndim != query.ndim:
            raise ValueError(
                f"{name} must have the query's rank {query.ndim}; got shape {x.shape}"
            )
    if query.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            "query dtype must be float16, bfloat16, float32 or float64; got " f"{query.dtype}"
        )
    for name, x in (("key", key), ("value", value)):
        if x.dtype != query.dtype:
            raise TypeError(f"{name} dtype must equal query dtype {query.dtype}; got {x.dtype}")
    if value.shape != key.shape:
        raise ValueError(f"value shape {value.shape} must equal key shape {key.shape}")
    *qb, t, n, h = query.shape
    *kb, s, k, hk = key.shape
    if qb != kb:
        raise ValueError(
            f"key batch {tuple(kb)} must equal query batch {tuple(qb)} "
            f"(query {query.shape}, key {key.shape})"
        )
    if hk != h:
        raise ValueError(f"key head dim {hk} must equal query head dim {h}")
    if not 1 <= h <= MAX_HEAD_DIM:
        raise ValueError(f"head dim must be in [1, {MAX_HEAD_DIM}]; got {h}")
    if t < 1 or s < 1:
        raise ValueError(f"sequence lengths must be >= 1; got query {t}, key {s}")
    if k < 1 or n % k != 0:
        raise ValueError(f"key has {k} heads; it must divide query's {n}")


def _static_scale(scale: Any, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, jax.core.Tracer):
        raise TypeError("scale must be a static Python or NumPy number, not a traced value")
    value = float(np.asarray(scale))
    if not math.isfinite(value):
        raise ValueError(f"scale must be finite; got {value}")
    return value


# --- custom VJP -----------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _flash_attention(q, k, v, scale, is_causal, implementation):
    return _forward_call(q, k, v, scale, is_causal, implementation)


def _flash_attention_fwd(q, k, v, scale, is_causal, implementation):
    out, lse = _forward_call(q, k, v, scale, is_causal, implementation)
    return (out, lse), (q, k, v, out, lse)


def _flash_attention_bwd(scale, is_causal, implementation, residuals, cotangents):
    q, k, v, out, lse = residuals
    dout, _ = cotangents  # lse leaves attention() under stop_gradient
    dq, dk, dv = _backward_call(
        q, k, v, out, lse, dout.astype(q.dtype), scale, is_causal, implementation
    )
    return dq, dk, dv


_flash_attention.defvjp(_flash_attention_fwd, _flash_attention_bwd)


# --- FFI calls --------------------------------------------------------------
# Attributes are typed NumPy scalars matching the handlers' Attr types: scale
# is float64 (exact for float64 inputs), is_causal and implementation int32.
# vmap_method="broadcast_all" gives the handlers inputs with extra leading
# (batch) dims, which they fold into batch.


def _result_type(like: jax.Array, shape, dtype):
    """The type of an FFI result, derived from the input `like`.

    ffi_call outputs take exactly the type we declare. Inside shard_map a
    result must vary over the same manual mesh axes as the inputs (else the
    custom VJP's cotangent types stop matching the primal's), so the result
    is `like`'s abstract value with a new shape and dtype, keeping its mesh.
    """
    aval = jax.typeof(like)
    sharding = getattr(aval, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
        # Same (abstract) mesh, nothing partitioned, at the result's rank.
        spec = jax.sharding.PartitionSpec(*([None] * len(shape)))
        return aval.update(
            shape=tuple(shape),
            dtype=jnp.dtype(dtype),
            weak_type=False,
            sharding=jax.sharding.NamedSharding(sharding.mesh, spec),
        )
    return jax.ShapeDtypeStruct(shape, dtype)


def _row_stats_type(q: jax.Array) -> jax.ShapeDtypeStruct:
    """lse/delta: [..., N, T], float32 (float64 for float64 inputs)."""
    *batch, t, n, _ = q.shape
    return _result_type(q, (*batch, n, t), jnp.promote_types(q.dtype, jnp.float32))


def _attributes(scale, is_causal, implementation):
    return dict(
        scale=np.float64(scale),
        is_causal=np.int32(is_causal),
        implementation=np.int32(implementation),
    )


def _forward_call(q, k, v, scale, is_causal, implementation):
    result_types = (
        _result_type(q, q.shape, q.dtype),  # out
        _row_stats_type(q),  # lse
    )
    call = jax.ffi.ffi_call(_registration.FWD_TARGET, result_types, vmap_method="broadcast_all")
    return call(q, k, v, **_attributes(scale, is_causal, implementation))


def _backward_call(q, k, v, out, lse, dout, scale, is_causal, implementation):
    result_types = (
        _result_type(q, q.shape, q.dtype),  # dq
        _result_type(k, k.shape, k.dtype),  # dk
        _result_type(v, v.shape, v.dtype),  # dv
        _row_stats_type(q),  # delta (scratch)
    )
    call = jax.ffi.ffi_call(_registration.BWD_TARGET, result_types, vmap_method="broadcast_all")
    dq, dk, dv, _ = call(q, k, v, out, lse, dout, **_attributes(scale, is_causal, implementation))
    return dq, dk, dv
