"""Equinox adapter: ``MultiheadAttention``, a drop-in for ``equinox.nn.MultiheadAttention``.

It is that class, with the attention itself computed by ``jax_flash.attention``:
same constructor arguments, fields and initialization (built with the same key
it has the same weights, so a model can swap the class or load the other's
weights), same call on unbatched ``[seq, features]`` inputs, used under
``jax.vmap`` as Equinox users do.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from jax_flash.attention import attention

__all__ = ["MultiheadAttention"]


class MultiheadAttention(eqx.nn.MultiheadAttention):
    """``equinox.nn.MultiheadAttention`` with fused attention.

    Call: ``(query [q_seq, query_size], key_ [kv_seq, key_size], value
    [kv_seq, value_size], mask=None, *, key=None, inference=None,
    deterministic=None, process_heads=None, is_causal=False, sinks=None) ->
    [q_seq, output_size]``. ``mask`` is bool ``[q_seq, kv_seq]`` or
    ``[num_heads, q_seq, kv_seq]``, True = attend; ``is_causal=True`` is the
    causal mask without materializing one. Dropout (``dropout_p``, unless
    ``inference``) acts on the attention probabilities, one mask per head,
    from ``key``. ``sinks``: float ``[num_heads]`` attention sinks (gpt-oss),
    as in ``jax_flash.attention``, with their gradient; a model keeps them as
    its own parameter (the fields here stay equinox's, so that weights load
    either way) and passes them in.
    """

    def __call__(self, query, key_, value, mask=None, *, key=None, inference=None,
                 deterministic=None, process_heads=None, is_causal: bool = False, sinks=None):
        if deterministic is not None:  # deprecated spelling in equinox too
            inference = deterministic
        if inference is None:
            inference = self.dropout.inference
        q_seq, kv_seq = query.shape[0], key_.shape[0]
        if key_.shape[0] != value.shape[0]:
            raise ValueError(f"key_ has {kv_seq} rows but value has {value.shape[0]}")

        def project(proj, x):  # [seq, features] -> [seq, heads, head_size]
            return jax.vmap(proj)(x).reshape(x.shape[0], self.num_heads, -1)

        q_heads = project(self.query_proj, query)
        k_heads = project(self.key_proj, key_)
        v_heads = project(self.value_proj, value)
        if process_heads is not None:
            shapes = (q_heads.shape, k_heads.shape, v_heads.shape)
            q_heads, k_heads, v_heads = process_heads(q_heads, k_heads, v_heads)
            if (q_heads.shape, k_heads.shape, v_heads.shape) != shapes:
                raise ValueError("process_heads must not change the shape of the heads.")
        if mask is not None:
            mask = jnp.asarray(mask, bool)
            if mask.shape not in ((q_seq, kv_seq), (self.num_heads, q_seq, kv_seq)):
                raise ValueError(
                    f"mask must be [q_seq, kv_seq] = {(q_seq, kv_seq)} or [num_heads, q_seq, kv_seq]; "
                    f"got {mask.shape}")
        rate = 0.0 if inference else float(self.dropout.p)
        if rate > 0 and key is None:
            raise RuntimeError("dropout needs a `key` (or pass inference=True)")
        attn = attention(
            q_heads, k_heads, v_heads, None, mask, is_causal=is_causal,
            dropout_rate=rate, dropout_rng=key if rate > 0 else None, sinks=sinks,
        )  # [q_seq, heads, vo_size]
        return jax.vmap(self.output_proj)(attn.reshape(q_seq, -1))
