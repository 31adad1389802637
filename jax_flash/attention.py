"""``jax_flash.attention``: the public function and its argument checks.

Arguments are validated and normalized here (errors name the argument and the
expected vs actual shape or dtype); _kernel_call.py holds the custom VJP and
the FFI calls."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash._kernel_call import (
    DROPOUT_SHARED,
    HAS_BIAS,
    HAS_KV_SEQLENS,
    HAS_MASK,
    HAS_Q_SEQLENS,
    HAS_SEGMENT_RANGES,
    HAS_SEGMENTS,
    NUM_FEATURE_OPERANDS,
    SEGMENT_BLOCK,
    KernelConfig,
    flash_attention,
)

MAX_HEAD_DIM = 256
# `implementation` values and the FFI attribute each maps to.
IMPLEMENTATIONS = {None: 0, "generic": 1, "sm80": 2, "sm90": 3}
SUPPORTED_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)


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
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    logits_soft_cap: float | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    dropout_broadcast: bool = False,
    implementation: str | None = None,
    deterministic: bool = False,
    sinks: jax.Array | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Fused scaled dot-product attention, a drop-in for ``jax.nn.dot_product_attention``.

    Computes ``softmax(scale * query @ key^T + bias, masked) @ value`` per head
    without materializing the ``[T, S]`` logits, on the CPU (C++ kernels) or an
    NVIDIA GPU (CUDA kernels), with a fused backward pass.

    Letters as in ``jax.nn.dot_product_attention``: B batch, T query length,
    S key/value length, N query heads, K key/value heads (K divides N: GQA/MQA),
    H head dim (1 to 256); B may be 0 (empty results), T, S, N, K are at least
    1 (a ValueError otherwise). Logits are ``scale * q.k``, then
    ``logits_soft_cap * tanh(logits / logits_soft_cap)``, then ``+ bias``, then
    every mask below; a query row with no visible key returns zeros (and zero
    gradients) where jax would average over all keys.

    Arguments:
      query: ``[B, T, N, H]`` or ``[T, N, H]``; float16, bfloat16, float32 or
        float64 (float64 on the CPU only).
      key: ``[B, S, K, H]`` or ``[S, K, H]``, the query's dtype.
      value: the key's shape and dtype.
      bias: additive, float, broadcastable to ``[B, N, T, S]`` (fewer dims are
        padded on the left, as jax does); never materialized larger. A
        float16/bfloat16 bias of the query's dtype is read in that dtype (no
        float32 copy); any other is taken in float32 (float64 for float64
        inputs). Its gradient comes back in its own shape and dtype (summed
        in float32 over the dims it broadcasts along).
      mask: bool, broadcastable to ``[B, N, T, S]``, True = attend (e.g. a key
        padding mask ``[B, 1, 1, S]``).
      scale: multiplies the logits; default ``1 / sqrt(H)``. A Python or NumPy
        number (it is compiled into the kernel call).
      is_causal: top-left aligned causal mask: query ``i`` attends keys ``j <= i``.
      query_seq_lengths, key_value_seq_lengths: int32 ``[B]``; positions at or
        past a length are padding (padded query rows return zeros).
      local_window_size: ``w`` or ``(left, right)``: query ``i`` attends keys
        ``i - left <= j <= i + right``; blocks outside are skipped.
      return_residual: also return the natural-log logsumexp of the final
        logits, shape ``[B, T, N]`` (or ``[T, N]``) in the query's dtype, as jax
        does. It carries no gradient.
      q_segment_ids, kv_segment_ids: int32 ``[B, T]`` and ``[B, S]`` (packed
        sequences): a query attends only keys with the same id. Both or neither.
      logits_soft_cap: positive float ``c``: logits become ``c * tanh(logits / c)``.
      dropout_rate: dropout on the attention probabilities, rescaled by
        ``1 / (1 - rate)``; the mask is a function of ``dropout_rng`` and the
        element position (16 random bits each: the rate is rounded to a
        multiple of 2^-16), regenerated in the backward, never stored.
      dropout_rng: a jax PRNG key, required when ``dropout_rate > 0``.
      dropout_broadcast: one dropout mask shared by every batch entry and head
        (flax's ``broadcast_dropout``) instead of one per (batch, head).
      sinks: attention sinks (gpt-oss, StreamingLLM): float ``[N]``, one
        logit per query head that joins every row's softmax denominator with
        no value, as an extra key column of logit ``sinks[n]`` (not scaled,
        capped or biased; never masked) and value zero. Its gradient is
        summed over batch and rows. A row with no visible key returns zeros
        and, with ``return_residual``, the sink as its logsumexp. Taken in
        float32 (float64 for float64 inputs).
      implementation: which CUDA kernel family runs: ``None`` picks the fastest
        that supports the inputs. On Hopper GPUs that is the sm90 (wgmma /
        TMA) family wherever it covers the call, forward and backward each
        on its own (any family gives the same gradients of the same out and
        lse). Its forward takes plain calls and the masks' features
        (sequence lengths, segment ids, windows, position offsets) with
        either a soft cap, dropout or a boolean mask contiguous along the
        keys (a boolean mask also beside a soft cap, a key-only one, [B|1,
        N|1, 1, S], beside dropout), and at head dims up to 128 a bias
        contiguous along the keys instead. Its backward takes plain calls,
        the masks' features with a boolean mask, a soft cap or dropout (not
        a soft cap with dropout, nor at head dim 64 a per-query mask with a
        soft cap), at head dims up to 128 also a bias contiguous along the
        keys (its gradient on the sm90 bias-gradient pass), and
        ``deterministic`` plain calls on its deterministic variant. Other
        calls run the sm80 kernels. ``"sm90"`` forces the Hopper forward
        (compute capability 9.x, 16-bit, head dim a multiple of 8, those
        features; an error otherwise) and, where it covers the call, the
        Hopper backward (sm80's otherwise);
        ``"sm80"`` forces the mma.sync tensor-core kernels
        (float16/bfloat16, head dim a multiple of 8, compute capability
        >= 8.0; an error otherwise), ``"generic"`` the exact SIMT kernels that
        take every dtype and head dim. The mma.sync kernels cover head dims up to
        256 (``deterministic=True``: up to 128; above that its backward runs
        the generic kernels). Ignored on the CPU.
      deterministic: bitwise-reproducible gradients. The default CUDA
        tensor-core backward adds each key block's share of dQ into a float32
        buffer with atomics (fastest; the summation order varies run to run);
        ``True`` computes dQ in a separate pass instead (on Hopper, plain
        16-bit calls up to head dim 256: the sm90 backward with dQ's adds
        in a fixed order, which takes the default's float32 scratch). The CPU backward is
        always deterministic; on the GPU the gradient of a broadcast ``bias``
        is summed with atomics either way.

    Returns:
      The attention output, shaped and typed like ``query``; with
      ``return_residual=True`` a tuple ``(output, logsumexp)``.
    """
    query, key, value = (jnp.asarray(x) for x in (query, key, value))
    _check_inputs(query, key, value)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a Python bool, got {type(is_causal).__name__}")
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic must be a Python bool, got {type(deterministic).__name__}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be one of {sorted(IMPLEMENTATIONS, key=str)}; got {implementation!r}"
        )
    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = query[None], key[None], value[None]
    b, t, n, h = query.shape
    s = key.shape[1]
    acc_dtype = jnp.promote_types(query.dtype, jnp.float32)
    features = 0
    operands = []

    bias4 = _broadcastable_4d("bias", bias, (b, n, t, s))
    if bias4 is not None:
        if not jnp.issubdtype(bias4.dtype, jnp.floating):
            raise TypeError(f"bias must be a float array; got {bias4.dtype}")
        features |= HAS_BIAS
        # A 16-bit bias of the query's own dtype goes to the kernels as it is:
        # up-casting it cost a full read and write of the largest operand
        # (issue 19), and the kernels add it in float32 anyway. Any other
        # bias is taken in the accumulation type, as before.
        if not (bias4.dtype == query.dtype and query.dtype in (jnp.float16, jnp.bfloat16)):
            bias4 = bias4.astype(acc_dtype)
    operands.append(bias4 if bias4 is not None else jnp.zeros((1, 1, 1, 1), acc_dtype))

    mask4 = _broadcastable_4d("mask", mask, (b, n, t, s))
    if mask4 is not None:
        if mask4.dtype != jnp.bool_:
            raise TypeError(f"mask must be bool (True = attend); got {mask4.dtype}")
        features |= HAS_MASK
    operands.append(mask4 if mask4 is not None else jnp.ones((1, 1, 1, 1), jnp.bool_))

    for name, lengths, bit in (
        ("query_seq_lengths", query_seq_lengths, HAS_Q_SEQLENS),
        ("key_value_seq_lengths", key_value_seq_lengths, HAS_KV_SEQLENS),
    ):
        if lengths is not None:
            lengths = _int32_array(name, lengths, (b,), unbatched)
            features |= bit
        operands.append(lengths if lengths is not None else jnp.zeros((1,), jnp.int32))

    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("q_segment_ids and kv_segment_ids must be given together")
    if q_segment_ids is not None:
        q_ids = _int32_array("q_segment_ids", q_segment_ids, (b, t), unbatched)
        kv_ids = _int32_array("kv_segment_ids", kv_segment_ids, (b, s), unbatched)
        operands += [q_ids, kv_ids, segment_block_ranges(q_ids), segment_block_ranges(kv_ids)]
        features |= HAS_SEGMENTS | HAS_SEGMENT_RANGES
    else:
        operands += [jnp.zeros((1, 1), jnp.int32)] * 4

    window = _window(local_window_size)
    softcap = _soft_cap(logits_soft_cap)
    rate = _dropout_rate(dropout_rate)
    if rate > 0:
        if dropout_rng is None:
            raise ValueError("dropout_rate > 0 needs dropout_rng (a jax PRNG key)")
        operands.append(jax.random.bits(dropout_rng, (2,), jnp.uint32))
        if dropout_broadcast:
            features |= DROPOUT_SHARED
    else:
        # One element, like the other placeholders: XLA keeps it a literal
        # (a [2] of zeros compiled to a broadcast, one more GPU launch a call).
        operands.append(jnp.zeros((1,), jnp.uint32))
    operands.append(jnp.zeros((1,), jnp.int32))  # position offsets: none (top-left aligned)

    static = KernelConfig(
        scale=_static_scale(scale, h),
        is_causal=bool(is_causal),
        implementation=IMPLEMENTATIONS[implementation],
        features=features,
        window_left=window[0],
        window_right=window[1],
        softcap=softcap,
        dropout_rate=rate,
        deterministic=bool(deterministic),
    )
    assert len(operands) == NUM_FEATURE_OPERANDS
    out, lse = flash_attention(query, key, value, _sinks(sinks, n, acc_dtype), *operands, static)
    if unbatched:
        out, lse = out[0], lse[0]
    if not return_residual:
        return out
    # lse is [..., N, T] (float32); jax returns [..., T, N] in the input dtype.
    residual = jax.lax.stop_gradient(jnp.swapaxes(lse, -1, -2).astype(out.dtype))
    return out, residual


def _sinks(sinks, n: int, dtype) -> jax.Array | None:
    """sinks as a float [N] array of the row statistics' dtype, or None."""
    if sinks is None:
        return None
    sinks = jnp.asarray(sinks)
    if sinks.shape != (n,):
        raise ValueError(f"sinks must have shape [N] = ({n},), one logit per query head; got {sinks.shape}")
    if not jnp.issubdtype(sinks.dtype, jnp.floating):
        raise TypeError(f"sinks must be a float array; got {sinks.dtype}")
    return sinks.astype(dtype)


def segment_block_ranges(ids: jax.Array, block: int = SEGMENT_BLOCK) -> jax.Array:
    """(min, max) id of every `block` positions: int32 ``[..., ceil(T / block), 2]``.

    The kernels' block classification (ffi/common/mask_policy.h): a query block
    and a key block whose id ranges are disjoint share no visible pair and are
    skipped; two blocks of one single id need no per-element id check. One
    small pass over the ids per call. The last entry covers the tail only.
    """
    *lead, t = ids.shape
    blocks = -(-t // block)
    padded = ids
    if blocks * block > t:  # the last id repeated (concatenated: jnp.pad's edge mode slices
        # every axis, which explicit sharding of the batch refuses)
        tail = jnp.broadcast_to(ids[..., -1:], (*lead, blocks * block - t))
        padded = jnp.concatenate([ids, tail], axis=-1)
    padded = padded.reshape(*lead, blocks, block)
    return jnp.stack([padded.min(-1), padded.max(-1)], axis=-1)


def _broadcastable_4d(name, x, full_shape):
    """x padded on the left to 4 dims, each 1 or the full size; None stays None."""
    if x is None:
        return None
    x = jnp.asarray(x)
    if x.ndim > 4:
        raise ValueError(f"{name} must have at most 4 dims [B, N, T, S]; got shape {x.shape}")
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    for dim, size, letter in zip(x.shape, full_shape, "BNTS"):
        if dim not in (1, size):
            raise ValueError(
                f"{name} shape {x.shape} does not broadcast to [B, N, T, S] = {tuple(full_shape)} "
                f"(dim {letter} is {dim})"
            )
    return x


def _int32_array(name, x, shape, unbatched):
    x = jnp.asarray(x)
    if unbatched and x.shape == shape[1:]:
        x = x[None]
    if x.dtype != jnp.int32:
        raise TypeError(f"{name} must be int32; got {x.dtype}")
    if x.shape != shape:
        raise ValueError(f"{name} must have shape {shape}; got {x.shape}")
    return x


def _window(local_window_size) -> tuple[int, int]:
    if local_window_size is None:
        return (-1, -1)
    if isinstance(local_window_size, (int, np.integer)):
        local_window_size = (local_window_size, local_window_size)
    try:
        left, right = (int(w) for w in local_window_size)
    except (TypeError, ValueError):
        raise TypeError(
            f"local_window_size must be an int or (left, right); got {local_window_size!r}"
        ) from None
    if left < 0 or right < 0:
        raise ValueError(f"local_window_size must be non-negative; got {(left, right)}")
    return (left, right)


def _soft_cap(cap) -> float:
    if cap is None:
        return 0.0
    if isinstance(cap, jax.core.Tracer):
        raise TypeError("logits_soft_cap must be a static number, not a traced value")
    cap = float(cap)
    if not (cap > 0 and math.isfinite(cap)):
        raise ValueError(f"logits_soft_cap must be a positive finite number; got {cap}")
    return cap


def _dropout_rate(rate) -> float:
    if isinstance(rate, jax.core.Tracer):
        raise TypeError("dropout_rate must be a static number, not a traced value")
    rate = float(rate)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1); got {rate}")
    return rate


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
    # A batch of size 0 is fine (empty results); zero heads is a configuration
    # error, reported here at trace time rather than as an empty result.
    if n < 1:
        raise ValueError(f"query must have at least one head (N >= 1); got shape {query.shape}")
    if k < 1:
        raise ValueError(f"key must have at least one head (K >= 1); got shape {key.shape}")
    if n % k != 0:
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
