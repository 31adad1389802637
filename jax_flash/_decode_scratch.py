"""The float32 scratch of the CUDA split-KV decode kernels, sized at trace time.

A forward call with a few queries over many keys (and every paged call) runs
on CUDA as several blocks per sequence, each over a share of the keys, whose
partial outputs and logsumexps a combine step merges (ffi/cuda/decode/). The
partials live in a scratch buffer that XLA allocates as an extra result of
the call (nothing is allocated inside a handler). This is
ffi/cuda/decode/launch.h's DecodeMaxSplits / DecodeScratchFloats, number for
number: the handler recomputes them and, should the buffer be smaller (other
shapes than foreseen), keeps the call on the training kernels.
"""

from __future__ import annotations

import math

# ffi/cuda/decode/kernel_traits.cuh and launch.h.
BLOCK_ROWS = 64  # packed (query, head) rows per block
BLOCK_KEYS = 64  # keys per K/V tile
MIN_TILES_PER_SPLIT = 4
MAX_SPLIT_BLOCKS = 1024
MAX_SPLITS = 128
MAX_QUERIES = 64  # the decode path's seqlen_q limit


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def max_splits(sequences: int, seqlen_q: int, num_heads: int, num_heads_k: int, seqlen_k: int) -> int:
    tiles = _ceil_div(seqlen_k, BLOCK_KEYS)
    by_work = max(1, tiles // MIN_TILES_PER_SPLIT)
    per_split = sequences * num_heads_k * _ceil_div(seqlen_q * (num_heads // num_heads_k), BLOCK_ROWS)
    by_grid = max(1, MAX_SPLIT_BLOCKS // max(1, per_split))
    return min(by_work, by_grid, MAX_SPLITS)


def scratch_floats(sequences: int, seqlen_q: int, num_heads: int, num_heads_k: int, seqlen_k: int,
                   head_dim: int) -> int:
    """Elements of the scratch a call needs (0: one split, none)."""
    splits = max_splits(sequences, seqlen_q, num_heads, num_heads_k, seqlen_k)
    return splits * sequences * num_heads * seqlen_q * (head_dim + 1) if splits > 1 else 0


def forward_scratch_floats(q_shape, k_shape, dtype, implementation: int) -> int:
    """What jax_flash.attention's forward asks for: decode-shaped 16-bit calls
    of the automatic dispatch only (the handler decides the rest at run time)."""
    import jax.numpy as jnp

    *lead, t, n, h = q_shape
    s, kh = k_shape[-3], k_shape[-2]
    if not (implementation == 0 and dtype in (jnp.float16, jnp.bfloat16) and h % 8 == 0 and h <= 256
            and t <= MAX_QUERIES and t < s and n % kh == 0):
        return 0
    return scratch_floats(math.prod(lead), t, n, kh, s, h)
