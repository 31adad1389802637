"""Flax adapter: ``attention_fn`` for ``nnx.MultiHeadAttention`` and
``linen.MultiHeadDotProductAttention``.

    import jax_flash.flax
    attn = nnx.MultiHeadAttention(num_heads=8, in_features=512, decode=False,
                                  attention_fn=jax_flash.flax.attention_fn, rngs=rngs)

It takes the arguments of ``flax.nnx.dot_product_attention`` (and linen's):
query ``[batch..., q_len, heads, head_dim]``, key/value ``[batch..., kv_len,
heads, head_dim]``, ``bias``/``mask`` broadcastable to ``[batch..., heads,
q_len, kv_len]`` (decode caches pass such masks), dropout on the attention
probabilities. Anything it cannot honour raises instead of silently computing
something else.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from jax_flash.attention import attention

__all__ = ["attention_fn"]


def attention_fn(
    query,
    key,
    value,
    bias=None,
    mask=None,
    broadcast_dropout: bool = True,
    dropout_rng=None,
    dropout_rate: float = 0.0,
    deterministic: bool = False,
    dtype=None,
    precision=None,
    module=None,
    promote_dtype=None,
    is_causal: bool = False,
    force_fp32_for_softmax: bool = False,
    einsum_dot_general=None,
    qk_attn_weights_einsum=None,
    attn_weights_value_einsum=None,
    **unsupported,
):
    """Drop-in for ``flax.nnx.dot_product_attention`` / ``flax.linen.dot_product_attention``.

    Arguments:
      query: ``[batch..., q_len, heads, head_dim]``.
      key, value: ``[batch..., kv_len, heads, head_dim]``.
      bias: additive, broadcastable to ``[batch..., heads, q_len, kv_len]``.
      mask: bool, same broadcasting, True = attend.
      broadcast_dropout: one dropout mask for all batch entries and heads (as flax).
      dropout_rng, dropout_rate, deterministic: dropout on the probabilities,
        off when ``deterministic`` or the rate is 0.
      dtype: computation (and output) dtype; default: the promoted input dtype.
      precision: accepted for compatibility; the kernels accumulate in float32.
      module: must be None (attention weights are never materialized, so they
        cannot be sown).
      is_causal: causal mask without materializing one (nnx only passes it when asked).

    Returns:
      ``[batch..., q_len, heads, head_dim]``.
    """
    if unsupported:
        raise TypeError(f"jax_flash.flax.attention_fn got unsupported arguments {sorted(unsupported)}")
    if module is not None:
        raise NotImplementedError(
            "jax_flash.flax.attention_fn cannot sow attention weights (they are never "
            "materialized); construct the attention module with sow_weights=False")
    for name, fn in (("einsum_dot_general", einsum_dot_general),
                     ("qk_attn_weights_einsum", qk_attn_weights_einsum),
                     ("attn_weights_value_einsum", attn_weights_value_einsum)):
        if fn is not None:
            raise NotImplementedError(f"jax_flash.flax.attention_fn does not take {name}")
    del precision, force_fp32_for_softmax  # float32 accumulation throughout
    if promote_dtype is not None:
        query, key, value = promote_dtype((query, key, value), dtype=dtype)
    else:
        dtype = dtype or jnp.result_type(query, key, value)
        query, key, value = (jnp.asarray(x, dtype) for x in (query, key, value))
    if query.ndim < 3:
        raise ValueError(f"query must be [batch..., q_len, heads, head_dim]; got {query.shape}")

    batch_dims = query.shape[:-3]
    flat = math.prod(batch_dims) if batch_dims else 1
    q_len, heads = query.shape[-3:-1]

    def flatten_batch(x):  # [batch..., ...] -> [B, ...]
        return x.reshape((flat,) + x.shape[len(batch_dims):])

    def flatten_logits_shaped(name, x):
        """Broadcastable to [batch..., N, T, S] -> [B or 1, N', T', S']."""
        x = jnp.asarray(x)
        full_rank = len(batch_dims) + 3
        if x.ndim > full_rank:
            raise ValueError(f"{name} has shape {x.shape}; expected at most {full_rank} dims "
                             "[batch..., heads, q_len, kv_len]")
        x = x.reshape((1,) * (full_rank - x.ndim) + x.shape)
        tail = x.shape[len(batch_dims):]
        if all(d == 1 for d in x.shape[: len(batch_dims)]):
            return x.reshape((1,) + tail)  # shared by every batch entry: stays unbroadcast
        return jnp.broadcast_to(x, batch_dims + tail).reshape((flat,) + tail)

    use_dropout = not deterministic and dropout_rate > 0.0
    if use_dropout and dropout_rng is None:
        raise ValueError("dropout_rate > 0 and not deterministic needs dropout_rng")
    out = attention(
        flatten_batch(query),
        flatten_batch(key),
        flatten_batch(value),
        None if bias is None else flatten_logits_shaped("bias", bias),
        None if mask is None else flatten_logits_shaped("mask", mask).astype(bool),
        is_causal=is_causal,
        dropout_rate=dropout_rate if use_dropout else 0.0,
        dropout_rng=dropout_rng if use_dropout else None,
        dropout_broadcast=broadcast_dropout,
    )
    return out.reshape(batch_dims + (q_len, heads, value.shape[-1])).astype(dtype or out.dtype)
