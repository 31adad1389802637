"""Paged attention by gathering the cache, then ``jax_flash.attention``'s forward.

The CUDA path of ``jax_flash.paged_attention`` until a native paged kernel
exists, and the tests' oracle for the CPU kernel. It copies each sequence's
visible positions out of the pool into a contiguous ``[B, S', K, H]`` array
(``S'`` = the table's capacity, or ``Tq + window`` with a window) and runs
the contiguous kernels on it, so it costs one extra read and write of those
keys and values.

``jax_flash.attention`` has no query position offsets (its causal mask is
top-left aligned and its window is relative to the query's index), but a
sequence's new tokens sit at the *end* of its keys, at a different position
in every sequence. Both orders are therefore reversed, which makes the
ragged bottom-right alignment a fixed top-left one:

- key ``j'`` of the gathered array is position ``p = len - 1 - j'`` (newest
  first), so padding past a short sequence is at the end, hidden by
  ``key_value_seq_lengths = len`` (whole blocks of it skipped);
- query ``t'`` is token ``t = Tq - 1 - t'`` (position ``len - 1 - t'``), so
  "``p <= len - Tq + t``" becomes ``j' >= t'`` and "``p >= len - Tq + t - w``"
  becomes ``j' <= t' + w``: the window ``(left=0, right=w)``.

No mask array, no per-sequence offsets; attention sees only features its
fast kernels take (lengths and a window).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_flash.attention import attention


def gather_positions(cache, block_tables, positions):
    """cache[block_tables[b, p // bs], p % bs] for positions ``[B, S']``:
    ``[B, S', K, H]``. Positions are clamped into the table and block ids into
    the pool (the documented clamping; callers hide what they do not need)."""
    num_blocks, block_size = cache.shape[:2]
    capacity = block_tables.shape[1] * block_size
    positions = jnp.clip(positions, 0, capacity - 1)
    blocks = jnp.take_along_axis(block_tables, positions // block_size, axis=1)
    blocks = jnp.clip(blocks, 0, num_blocks - 1)
    return cache[blocks, positions % block_size]


def paged_attention_by_gather(query, key_cache, value_cache, block_tables, lengths, *, config):
    """out ``[B, Tq, N, H]`` and lse ``[B, Tq, N]`` (query dtype), as the CPU kernel."""
    tq = query.shape[1]
    capacity = block_tables.shape[1] * key_cache.shape[1]
    window = config.window_left
    # Keys a query can see: all of the table, or the window's span behind the newest token.
    span = capacity if window < 0 else min(capacity, tq + window)
    lengths = jnp.clip(lengths, 0, capacity)
    positions = lengths[:, None] - 1 - jnp.arange(span, dtype=jnp.int32)[None, :]  # newest first
    keys = gather_positions(key_cache, block_tables, positions)
    values = gather_positions(value_cache, block_tables, positions)
    out, lse = attention(
        query[:, ::-1],
        keys,
        values,
        scale=config.scale,
        key_value_seq_lengths=jnp.minimum(lengths, span),
        # right = span: no bound (every gathered key is at most span - 1 away)
        local_window_size=(0, window if window >= 0 else span),
        logits_soft_cap=config.softcap if config.softcap > 0 else None,
        return_residual=True,
    )
    return out[:, ::-1], lse[:, ::-1]
