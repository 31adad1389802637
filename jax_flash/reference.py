"""Plain ``jax.numpy`` attention with jax_flash's semantics.

Materializes the ``[T, S]`` logits: for tests, debugging and small inputs.
Computes in the inputs' dtype promoted to at least float32 (float64 inputs
stay float64, which the tests use as ground truth).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def visibility(b, n, t, s, *, mask=None, is_causal=False, query_seq_lengths=None,
               key_value_seq_lengths=None, local_window_size=None, q_segment_ids=None,
               kv_segment_ids=None):
    """Bool [B, N, T, S]: which (query, key) pairs the masks leave visible."""
    i = jnp.arange(t)[:, None]
    j = jnp.arange(s)[None, :]
    vis = jnp.ones((b, n, t, s), bool)
    if mask is not None:
        m = jnp.asarray(mask)
        vis = vis & m.reshape((1,) * (4 - m.ndim) + m.shape)
    if is_causal:
        vis = vis & (j <= i)
    if local_window_size is not None:
        left, right = (local_window_size, local_window_size) if isinstance(
            local_window_size, int) else local_window_size
        vis = vis & (j >= i - left) & (j <= i + right)
    if query_seq_lengths is not None:
        vis = vis & (jnp.arange(t)[None, None, :, None] < query_seq_lengths[:, None, None, None])
    if key_value_seq_lengths is not None:
        vis = vis & (jnp.arange(s)[None, None, None, :] < key_value_seq_lengths[:, None, None, None])
    if q_segment_ids is not None:
        vis = vis & (q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :])
    return vis


def attention(query, key, value, bias=None, *, scale=None, logits_soft_cap=None,
              dropout_factor=None, return_residual=False, sinks=None, **mask_kwargs):
    """Reference attention on ``[B, T, N, H]`` / ``[B, S, K, H]`` inputs.

    ``mask_kwargs`` are those of :func:`visibility`. ``dropout_factor``, if
    given, is a ``[B, N, T, S]`` array multiplying the probabilities (0 or
    1 / (1 - rate)). ``sinks`` ``[N]``: an extra key column per query head
    with logit ``sinks[n]`` and value zero, visible to every row (in the
    softmax only). Rows with no visible key give zeros and a logsumexp of
    ``-inf`` (the sink's logit with sinks; jax_flash's contract). Returns
    ``out`` (input dtype) or ``(out, lse)`` with ``lse`` ``[B, N, T]`` in the
    compute dtype.
    """
    b, t, n, h = query.shape
    s, k = key.shape[1], key.shape[2]
    compute = jnp.promote_types(query.dtype, jnp.float32)
    scale = 1.0 / math.sqrt(h) if scale is None else scale
    kf = jnp.repeat(key.astype(compute), n // k, axis=2)
    vf = jnp.repeat(value.astype(compute), n // k, axis=2)
    logits = jnp.einsum("btnh,bsnh->bnts", query.astype(compute), kf) * scale
    if logits_soft_cap is not None:
        logits = logits_soft_cap * jnp.tanh(logits / logits_soft_cap)
    if bias is not None:
        bias = jnp.asarray(bias, compute)
        logits = logits + bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
    vis = visibility(b, n, t, s, **mask_kwargs)
    logits = jnp.where(vis, logits, -jnp.inf)
    if sinks is not None:  # the sink column, last; sliced off before the values
        sink = jnp.broadcast_to(jnp.asarray(sinks, compute)[None, :, None, None], (b, n, t, 1))
        logits = jnp.concatenate([logits, sink], axis=-1)
    lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    finite = jnp.isfinite(lse)
    probs = jnp.where(finite, jnp.exp(logits - jnp.where(finite, lse, 0.0)), 0.0)
    if sinks is not None:
        probs = probs[..., :s]
    if dropout_factor is not None:
        probs = probs * dropout_factor
    out = jnp.einsum("bnts,bsnh->btnh", probs, vf).astype(query.dtype)
    if return_residual:
        return out, lse[..., 0]
    return out


PHILOX_ROUNDS = 7  # mask_policy.h's kPhiloxRounds


def dropout_factor(seed, b, n, t, s, rate, shared=False):
    """The [B, N, T, S] dropout multipliers jax_flash's kernels draw (NumPy).

    Philox4x32 with 7 rounds keyed by ``seed`` (two uint32; 10 rounds until
    December 2026); 16 bits per pair, so one
    call serves 8 pairs: pair (i, j) takes the low (``i % 16 < 8``) or high
    16 bits of output word ``(j % 32) // 8`` of the call with counter
    ``((j // 32) * 8 + j % 8, (i // 16) * 8 + i % 8, h, b)`` (so rows ``i0,
    i0 + 8`` and keys ``j0, j0 + 8, j0 + 16, j0 + 24`` share a call).
    Dropped when its 16 bits are below ``round(rate * 2**16)``; kept ones
    are scaled by ``1 / (1 - rate)``. ``shared`` (broadcast dropout): one
    mask for every batch entry and head, that of (b, h) = (0, 0).
    """
    k0, k1 = (np.uint64(x) for x in np.asarray(seed, np.uint32))
    runs = -(-s // 32)
    row_calls = -(-t // 16) * 8
    gb, gn = (1, 1) if shared else (b, n)
    # One counter per (b, h, row call, run * 8 + lane): every call the kernels make.
    bb, hh, ii, cc = np.meshgrid(np.arange(gb), np.arange(gn), np.arange(row_calls), np.arange(runs * 8),
                                 indexing="ij")
    c0, c1, c2, c3 = (x.astype(np.uint64) for x in (cc, ii, hh, bb))
    mask32 = np.uint64(0xFFFFFFFF)
    for _ in range(PHILOX_ROUNDS):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & mask32
        hi1, lo1 = p1 >> np.uint64(32), p1 & mask32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + np.uint64(0x9E3779B9)) & mask32
        k1 = (k1 + np.uint64(0xBB67AE85)) & mask32
    words = np.stack((c0, c1, c2, c3), axis=-1)  # [gb, gn, row_calls, runs * 8, 4]
    i, j = np.arange(t)[:, None], np.arange(s)[None, :]
    word = words[..., i // 16 * 8 + i % 8, j // 32 * 8 + j % 8, j % 32 // 8]  # [gb, gn, t, s]
    bits = (word >> (np.uint64(16) * (i % 16 // 8).astype(np.uint64))) & np.uint64(0xFFFF)
    threshold = np.uint64(int(rate * 65536.0 + 0.5))
    return np.where(np.broadcast_to(bits, (b, n, t, s)) < threshold, 0.0, 1.0 / (1.0 - rate))


def paged_attention(query, key_cache, value_cache, block_tables, key_value_seq_lengths, *,
                    scale=None, logits_soft_cap=None, local_window_size=None,
                    sinks=None, return_residual=False):
    """Reference ``jax_flash.paged_attention``: gathers every sequence's whole
    table into ``[B, M * bs, K, H]`` in position order and masks by position.

    Same clamping as the kernels (lengths into ``[0, M * bs]``, block ids into
    ``[0, P)``). ``local_window_size`` is ``w`` or ``(w, 0)``; ``sinks`` as in
    :func:`attention`. Returns ``out``
    or ``(out, lse)`` with ``lse`` ``[B, Tq, N]`` in the compute dtype.
    """
    b, tq = query.shape[:2]
    num_blocks, block_size = key_cache.shape[:2]
    capacity = block_tables.shape[1] * block_size
    j = jnp.arange(capacity)
    blocks = jnp.clip(block_tables[:, j // block_size], 0, num_blocks - 1)  # [B, S]
    keys = key_cache[blocks, j % block_size]
    values = value_cache[blocks, j % block_size]
    lengths = jnp.clip(key_value_seq_lengths, 0, capacity)
    pos = lengths[:, None] - tq + jnp.arange(tq)[None, :]  # [B, Tq] query positions
    vis = (j[None, None, :] <= pos[:, :, None]) & (j[None, None, :] < lengths[:, None, None])
    if local_window_size is not None:
        left = local_window_size if isinstance(local_window_size, int) else local_window_size[0]
        vis = vis & (j[None, None, :] >= pos[:, :, None] - left)
    result = attention(query, keys, values, scale=scale, logits_soft_cap=logits_soft_cap,
                       mask=vis[:, None], sinks=sinks, return_residual=return_residual)
    if return_residual:
        out, lse = result
        return out, jnp.swapaxes(lse, -1, -2)
    return result
