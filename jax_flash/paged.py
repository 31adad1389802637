"""``jax_flash.paged_attention``: the newest tokens' attention over a paged KV cache.

Decoding keeps every sequence's keys and values in one pool of fixed-size
blocks; a block table per sequence lists its blocks in order, so sequences
grow block by block without copying and share one preallocated pool.

Arguments are validated here at trace time (errors name the argument and the
expected vs actual shape or dtype). The computation runs:

- on the CPU: the native paged kernel (``jax_flash_paged_fwd_v<N>``,
  ffi/cpu/paged_cpu.cc), which walks each sequence's blocks through its table;
- on CUDA, 16-bit inputs: the split-KV decode kernels (ffi/cuda/decode/),
  which read K/V through the block tables, several blocks per sequence each
  over a share of its keys, merged by their logsumexps;
- on CUDA, float32: the *gather fallback* (``_paged_gather.py``) that copies
  each sequence's visible positions into a contiguous ``[B, S, K, H]`` array
  and calls ``jax_flash.attention``'s forward on it (reading the cache twice).

The two are selected by ``lax.platform_dependent``: one function, one jaxpr,
each backend compiles its own branch.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash import _decode_scratch
from jax_flash import _registration
from jax_flash._kernel_call import _result_type, with_sinks
from jax_flash._paged_gather import paged_attention_by_gather
from jax_flash.attention import MAX_HEAD_DIM, SUPPORTED_DTYPES, _sinks, _soft_cap, _static_scale

__all__ = ["paged_attention", "PagedConfig"]


@dataclasses.dataclass(frozen=True)
class PagedConfig:
    """Everything compiled into the call (hashable: a nondiff argument)."""

    scale: float
    softcap: float  # 0: off
    window_left: int  # -1: off

    def attributes(self) -> dict:
        # Typed NumPy scalars matching the handler's Attr types (ffi_bindings.h).
        return dict(
            scale=np.float64(self.scale),
            softcap=np.float64(self.softcap),
            window_left=np.int64(self.window_left),
        )


def paged_attention(
    query: jax.Array,
    key_cache: jax.Array,
    value_cache: jax.Array,
    block_tables: jax.Array,
    key_value_seq_lengths: jax.Array,
    *,
    scale: float | None = None,
    logits_soft_cap: float | None = None,
    local_window_size: int | tuple[int, int] | None = None,
    sinks: jax.Array | None = None,
    return_residual: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Attention of each sequence's newest ``Tq`` tokens over its paged KV cache.

    Letters: B sequences, Tq new tokens per sequence, N query heads, K key/value
    heads (K divides N: GQA/MQA), H head dim (1 to 256), P blocks in the pool,
    bs positions per block, M entries per block table.

    Query ``t`` of sequence ``b`` sits at position
    ``p = key_value_seq_lengths[b] - Tq + t`` and sees the cache's keys at
    positions ``j <= p`` (causal within the new tokens; with a window also
    ``j >= p - w``). Position ``j`` of sequence ``b`` lives in block
    ``block_tables[b, j // bs]`` at offset ``j % bs``. The new tokens' own keys
    and values must already be in the cache (write them first, with an
    ordinary scatter: see the README's "Decoding with a paged cache").

    Arguments:
      query: ``[B, Tq, N, H]``; float16, bfloat16, float32 or float64 (float64
        on the CPU only).
      key_cache: ``[P, bs, K, H]``, the query's dtype: the pool shared by all
        sequences.
      value_cache: the key cache's shape and dtype.
      block_tables: int32 ``[B, M]``: the blocks of sequence ``b`` in order.
        Entries past a sequence's last block are never read (any value).
      key_value_seq_lengths: int32 ``[B]``: each sequence's length including
        the new tokens, ``0 < length <= M * bs``.
      scale: multiplies the logits; default ``1 / sqrt(H)``. A static number.
      logits_soft_cap: positive float ``c``: logits become ``c * tanh(logits / c)``.
      local_window_size: ``w`` (or ``(w, 0)``): a query at position ``p`` sees
        keys ``p - w <= j <= p``. The window's right side is always 0 (causal).
      sinks: attention sinks (gpt-oss, StreamingLLM): float ``[N]``, one
        logit per query head (not scaled, not soft-capped) that joins every
        query's softmax denominator with no value, as in
        ``jax_flash.attention``. A query that sees no key then returns
        zeros with logsumexp ``sinks[n]``. Applied to the kernels' output
        and float32 logsumexp (a pass over the output; not yet inside the
        decode kernels).
      return_residual: also return the natural-log logsumexp of each query's
        visible logits, ``[B, Tq, N]`` in the query's dtype (``-inf`` for a
        query that sees nothing), as ``jax_flash.attention`` does; it lets
        partial results over disjoint key sets be merged.

    Returns:
      ``[B, Tq, N, H]`` in the query's dtype; with ``return_residual=True`` a
      tuple ``(output, logsumexp)``.

    Values that cannot be checked at trace time are clamped, never trusted,
    so nothing is read outside the pool: a length is clamped into
    ``[0, M * bs]`` and a block id into ``[0, P)`` (an out-of-range id reads
    block 0 or block ``P - 1``). A sequence shorter than ``Tq`` (including
    length 0) puts its first queries at negative positions: those see no key
    and return zeros (logsumexp ``-inf``), like any fully masked row of
    ``jax_flash.attention``.

    Forward only: differentiating through it (``jax.grad``, ``jax.jvp``)
    raises a TypeError at trace time. Composes with ``jit`` and ``vmap``.
    """
    query, key_cache, value_cache = (jnp.asarray(x) for x in (query, key_cache, value_cache))
    block_tables, key_value_seq_lengths = _check_inputs(
        query, key_cache, value_cache, block_tables, key_value_seq_lengths
    )
    config = PagedConfig(
        scale=_static_scale(scale, query.shape[-1]),
        softcap=_soft_cap(logits_soft_cap),
        window_left=_window_left(local_window_size),
    )
    stats = jnp.promote_types(query.dtype, jnp.float32)
    sinks = _sinks(sinks, query.shape[2], stats)
    out, lse = _paged(query, key_cache, value_cache, block_tables, key_value_seq_lengths, config)
    if sinks is not None:  # (with_sinks takes lse as [..., N, Tq])
        out, lse = with_sinks(out, jnp.swapaxes(lse, -1, -2), sinks)
        lse = jnp.swapaxes(lse, -1, -2)
    if return_residual:
        return out, lse.astype(query.dtype)
    return out


# --- forward only ------------------------------------------------------------
# A custom_jvp whose rule raises: jax.grad and jax.jvp both reach the rule at
# trace time, so the error names this function instead of failing deep inside
# an FFI call that has no transpose.


@functools.partial(jax.custom_jvp, nondiff_argnums=(5,))
def _paged(query, key_cache, value_cache, block_tables, lengths, config):
    # CUDA: the split-KV decode kernels for 16-bit inputs, the gather through
    # attention's forward for float32 (which the tensor-core kernels do not take).
    # lse in the row statistics' type (float32, float64 for float64 queries)
    # on both, cast to the query's by paged_attention after the sinks.
    stats = jnp.promote_types(query.dtype, jnp.float32)

    def gather(*args, config):
        out, lse = paged_attention_by_gather(*args, config=config)
        return out, lse.astype(stats)

    on_cuda = (_native if query.dtype in (jnp.float16, jnp.bfloat16) else gather)
    return jax.lax.platform_dependent(
        query, key_cache, value_cache, block_tables, lengths,
        cpu=functools.partial(_native, config=config, scratch=0),
        default=functools.partial(on_cuda, config=config),
    )


@_paged.defjvp
def _paged_jvp(config, primals, tangents):
    raise TypeError(
        "jax_flash.paged_attention is forward only (decoding): it has no gradient. "
        "Differentiate jax_flash.attention on contiguous keys and values instead, or wrap the "
        "inputs in jax.lax.stop_gradient if no gradient is needed through this call."
    )


def _native(query, key_cache, value_cache, block_tables, lengths, *, config, scratch=None):
    """The native kernel (the CPU's, or on CUDA the split-KV decode kernels):
    out [..., B, Tq, N, H] (query dtype) and lse [..., B, Tq, N] (float32, or
    float64 for float64 queries). `scratch`:
    the decode partials' float32 elements (None: as CUDA needs them)."""
    *lead, tq, n, h = query.shape
    stats = jnp.promote_types(query.dtype, jnp.float32)
    if scratch is None:
        num_blocks, block_size, kh, _ = key_cache.shape[-4:]
        scratch = _decode_scratch.scratch_floats(
            int(np.prod(lead)), tq, n, kh, block_tables.shape[-1] * block_size, h)
    result_types = (
        _result_type(query, query.shape, query.dtype),
        _result_type(query, (*lead, n, tq), stats),
        _result_type(query, (max(scratch, 1),), jnp.float32),  # decode partials (scratch)
    )
    # broadcast_all: vmapped calls give every operand the same leading dims,
    # which the handler folds (ffi/common/paged_decode.h).
    call = jax.ffi.ffi_call(_registration.PAGED_FWD_TARGET, result_types,
                            vmap_method="broadcast_all")
    out, lse, _ = call(query, key_cache, value_cache, block_tables, lengths, **config.attributes())
    return out, jnp.swapaxes(lse, -1, -2)


# --- argument checks ---------------------------------------------------------


def _check_inputs(query, key_cache, value_cache, block_tables, lengths):
    if query.ndim != 4:
        raise ValueError(f"query must be [B, Tq, N, H]; got shape {query.shape} ({query.ndim}-D)")
    if key_cache.ndim != 4:
        raise ValueError(
            f"key_cache must be [num_blocks, block_size, K, H]; got shape {key_cache.shape} "
            f"({key_cache.ndim}-D)"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(
            f"value_cache shape {value_cache.shape} must equal key_cache shape {key_cache.shape}"
        )
    if query.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"query dtype must be float16, bfloat16, float32 or float64; got {query.dtype}"
        )
    for name, x in (("key_cache", key_cache), ("value_cache", value_cache)):
        if x.dtype != query.dtype:
            raise TypeError(f"{name} dtype must equal query dtype {query.dtype}; got {x.dtype}")
    b, tq, n, h = query.shape
    num_blocks, block_size, k, hk = key_cache.shape
    if hk != h:
        raise ValueError(
            f"key_cache head dim {hk} must equal query head dim {h} "
            f"(query {query.shape}, key_cache {key_cache.shape})"
        )
    if not 1 <= h <= MAX_HEAD_DIM:
        raise ValueError(f"head dim must be in [1, {MAX_HEAD_DIM}]; got {h}")
    if tq < 1 or n < 1:
        raise ValueError(f"query needs at least one token and one head; got shape {query.shape}")
    if num_blocks < 1 or block_size < 1 or k < 1:
        raise ValueError(
            "key_cache needs at least one block, one position per block and one head; "
            f"got shape {key_cache.shape}"
        )
    if n % k != 0:
        raise ValueError(f"key_cache has {k} heads; it must divide query's {n}")

    block_tables = jnp.asarray(block_tables)
    if block_tables.dtype != jnp.int32:
        raise TypeError(f"block_tables must be int32; got {block_tables.dtype}")
    if block_tables.ndim != 2 or block_tables.shape[0] != b or block_tables.shape[1] < 1:
        raise ValueError(
            f"block_tables must have shape [B, max_blocks] = [{b}, >= 1] (B from query "
            f"{query.shape}); got {block_tables.shape}"
        )
    lengths = jnp.asarray(lengths)
    if lengths.dtype != jnp.int32:
        raise TypeError(f"key_value_seq_lengths must be int32; got {lengths.dtype}")
    if lengths.shape != (b,):
        raise ValueError(
            f"key_value_seq_lengths must have shape ({b},) (B from query {query.shape}); "
            f"got {lengths.shape}"
        )
    return block_tables, lengths


def _window_left(local_window_size) -> int:
    if local_window_size is None:
        return -1
    if isinstance(local_window_size, (int, np.integer)):
        left, right = int(local_window_size), 0
    else:
        try:
            left, right = (int(w) for w in local_window_size)
        except (TypeError, ValueError):
            raise TypeError(
                f"local_window_size must be an int or (left, 0); got {local_window_size!r}"
            ) from None
    if left < 0:
        raise ValueError(f"local_window_size must be non-negative; got {local_window_size!r}")
    if right != 0:
        raise ValueError(
            "paged_attention is causal: local_window_size's right side must be 0; "
            f"got {local_window_size!r}"
        )
    return left
