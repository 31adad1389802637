"""Ring attention (context parallelism): ``jax_flash.ring_attention``.

Called inside ``shard_map`` with the sequence axis of q, k, v sharded over a
mesh axis of D devices. Each device keeps its query shard; the key/value
shards (and their segment ids) travel around the ring with ``lax.ppermute``,
one hop per step, the next hop sent before the step's kernel call so the
transfer can overlap the compute. Each step runs the fused forward kernel on
(local q, visiting k/v); the partial outputs are merged by their logsumexp.

The backward is a second ring (a ``jax.custom_vjp``): every step recomputes
its (q shard, kv shard) pair with the fused backward kernel, given the *final*
output and the *global* logsumexp (so P = exp(logits - lse) and delta =
rowsum(dO * O) are the global ones and the partial dq, dk, dv are exact);
dq is summed locally, dK/dV accumulators travel around the ring with K/V and
one last hop brings each back to the device that owns that K/V shard.

Causal masks need no position offsets in the kernels: between a query chunk
and a key chunk of the global sequence the mask is full (key chunk entirely
before), empty (entirely after: no kernel call) or the diagonal (the same
chunk: ``is_causal`` top-left aligned, exact since both start at the same
global position). See ``schedule`` for the per-step work of each layout.

A window is not block-structured that way: it crosses chunks at any offset.
With ``local_window_size`` every step instead runs one kernel call over all
(query chunk, key chunk) pairs of the two shards, stacked along the batch
axis, each with its global position offset (the kernels' ``position_offsets``
operand: query row i sits at key position i + offset), so causal and window
are exact; the kernels skip the blocks outside the band, so a pair the
window misses costs a launch's share and no compute.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_flash import _compat

from jax_flash._kernel_call import (
    HAS_POSITION_OFFSETS,
    HAS_SEGMENT_RANGES,
    HAS_SEGMENTS,
    NUM_FEATURE_OPERANDS,
    KernelConfig,
    _backward_call,
    _forward_call,
    row_delta,
    sinks_gradient,
    with_sinks,
)
from jax_flash.attention import (
    IMPLEMENTATIONS,
    _check_inputs,
    _int32_array,
    _sinks,
    _soft_cap,
    _static_scale,
    _window,
    segment_block_ranges,
)

LAYOUTS = ("zigzag", "contiguous")

__all__ = ["ring_attention", "zigzag", "unzigzag", "schedule", "LAYOUTS"]


def ring_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    axis_name: Any,
    is_causal: bool = False,
    scale: float | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    local_window_size: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    sinks: jax.Array | None = None,
    layout: str = "zigzag",
    implementation: str | None = None,
    deterministic: bool = False,
    return_residual: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Attention over a sequence sharded across the mesh axis ``axis_name``.

    Call it inside ``shard_map`` (or any context binding ``axis_name``) with
    the local shards: query ``[B, T, N, H]`` (or ``[T, N, H]``) holds this
    device's ``T`` of the ``D * T`` global positions, key/value
    ``[B, S, K, H]`` likewise, segment ids ``[B, T]`` / ``[B, S]`` sharded
    along their sequence axis the same way. Returns this device's shard of
    the output of ``jax_flash.attention`` on the global (unsharded) arrays.

    Arguments as in ``jax_flash.attention``, plus:
      axis_name: the mesh axis the sequence is sharded over (the ring).
      layout: which global positions a device holds (for ``is_causal=True``
        and for ``local_window_size``).
        ``"zigzag"`` (default): the global sequence is cut into ``2 D`` equal
        chunks and device ``d`` holds chunks ``d`` and ``2 D - 1 - d`` (its
        local ``T`` must be even); every device then does the same causal
        work. Prepare global arrays with ``jax_flash.ring.zigzag`` before
        sharding and restore the output with ``jax_flash.ring.unzigzag``.
        ``"contiguous"``: device ``d`` holds chunk ``d`` of ``D``; simpler,
        but under a causal mask device ``d`` has work in only ``d + 1`` of
        the ``D`` steps. Without ``is_causal`` or a window the layout changes
        nothing.
      return_residual: also return the global logsumexp ``[B, T, N]`` in the
        output dtype (no gradient), as ``jax_flash.attention`` does.
      sinks: attention sinks, float ``[N]`` as in ``jax_flash.attention``:
        one logit per query head for the whole sequence (replicated over the
        ring, or sharded with the heads), applied once to the merged output
        and logsumexp; its gradient sums every device's rows.

    ``local_window_size`` is relative to global positions, as in
    ``jax_flash.attention`` on the whole sequence (every ring step still
    passes K/V on; the steps a window leaves empty cost a kernel launch and
    no compute). Bias, mask, sequence lengths and dropout are not arguments
    of the ring (segment ids cover packing and padding: give padding its own
    id).
    """
    query, key, value = (jnp.asarray(x) for x in (query, key, value))
    _check_inputs(query, key, value)
    window = _window(local_window_size)
    for name, flag in (("is_causal", is_causal), ("deterministic", deterministic),
                       ("return_residual", return_residual)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a Python bool, got {type(flag).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be one of {sorted(IMPLEMENTATIONS, key=str)}; got {implementation!r}"
        )
    axis_size = _axis_size(axis_name)
    for name, x in (("query", query), ("key", key), ("value", value)):
        _check_sharded(name, x, axis_name)

    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = query[None], key[None], value[None]
    b, t, _, h = query.shape
    s = key.shape[1]
    if is_causal and s != t:
        raise ValueError(
            f"is_causal=True needs equal query and key shards (the same global positions); "
            f"got query length {t}, key length {s}"
        )
    windowed = local_window_size is not None
    if (is_causal or windowed) and layout == "zigzag" and axis_size > 1 and t % 2:
        raise ValueError(
            f"layout='zigzag' needs an even local sequence length (two chunks per device); got {t}"
        )
    if windowed and s != t:
        raise ValueError(
            f"local_window_size needs equal query and key shards (the same global positions); "
            f"got query length {t}, key length {s}"
        )

    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("q_segment_ids and kv_segment_ids must be given together")
    features = 0
    if q_segment_ids is not None:
        # Shapes of the local shards.
        q_segment_ids = _int32_array("q_segment_ids", q_segment_ids, (b, t), unbatched)
        kv_segment_ids = _int32_array("kv_segment_ids", kv_segment_ids, (b, s), unbatched)
        _check_sharded("q_segment_ids", q_segment_ids, axis_name)
        _check_sharded("kv_segment_ids", kv_segment_ids, axis_name)
        features |= HAS_SEGMENTS | HAS_SEGMENT_RANGES

    kernel = KernelConfig(
        scale=_static_scale(scale, h),
        is_causal=False,  # per call: the diagonal step sets it
        implementation=IMPLEMENTATIONS[implementation],
        features=features | (HAS_POSITION_OFFSETS if windowed else 0),
        window_left=window[0],
        window_right=window[1],
        softcap=_soft_cap(logits_soft_cap),
        dropout_rate=0.0,
        deterministic=bool(deterministic),
    )
    cfg = _RingConfig(
        axis_name=axis_name,
        axis_size=axis_size,
        is_causal=bool(is_causal),
        zigzag=bool(is_causal) and layout == "zigzag",
        kernel=kernel,
        windowed=windowed,
        chunks=2 if windowed and layout == "zigzag" and axis_size > 1 else 1,
    )
    sinks = _sinks(sinks, query.shape[2], jnp.promote_types(query.dtype, jnp.float32))
    out, lse = _ring(query, key, value, q_segment_ids, kv_segment_ids, sinks, cfg)
    if unbatched:
        out, lse = out[0], lse[0]
    if not return_residual:
        return out
    residual = lax.stop_gradient(jnp.swapaxes(lse, -1, -2).astype(out.dtype))
    return out, residual


# --- layouts ----------------------------------------------------------------


def _zigzag_order(axis_size: int) -> np.ndarray:
    """Global chunk held at each local chunk slot: d, 2D-1-d for d = 0..D-1."""
    return np.array([c for d in range(axis_size) for c in (d, 2 * axis_size - 1 - d)])


def _permute_chunks(x, axis_size, axis, order, name):
    if not isinstance(axis_size, (int, np.integer)) or axis_size < 1:
        raise ValueError(f"axis_size must be a positive int; got {axis_size!r}")
    x = jnp.asarray(x)
    axis = axis % x.ndim
    n = x.shape[axis]
    chunks = 2 * int(axis_size)
    if n % chunks:
        raise ValueError(
            f"{name}: length {n} of axis {axis} must be a multiple of 2 * axis_size = {chunks}"
        )
    split = x.reshape(*x.shape[:axis], chunks, n // chunks, *x.shape[axis + 1 :])
    # A static permutation: slices and a concatenate, no gather (jax 0.5's
    # XLA fails to verify a partitioned gather of x64 indices here).
    parts = [lax.slice_in_dim(split, int(c), int(c) + 1, axis=axis) for c in order]
    return jnp.concatenate(parts, axis=axis).reshape(x.shape)


def zigzag(x: jax.Array, axis_size: int, axis: int = 1) -> jax.Array:
    """Reorders the global sequence along ``axis`` for ``layout="zigzag"``.

    The sequence is cut into ``2 * axis_size`` equal chunks and reordered so
    that an even ``shard_map`` split of ``axis`` over ``axis_size`` devices
    gives device ``d`` the chunks ``d`` and ``2 * axis_size - 1 - d``.
    ``axis`` defaults to 1: ``[B, T, N, H]`` inputs and ``[B, T]`` segment ids.
    """
    return _permute_chunks(x, axis_size, axis, _zigzag_order(axis_size), "zigzag")


def unzigzag(x: jax.Array, axis_size: int, axis: int = 1) -> jax.Array:
    """The inverse of ``zigzag``: back to the global sequence order."""
    return _permute_chunks(x, axis_size, axis, np.argsort(_zigzag_order(axis_size)), "unzigzag")


def schedule(axis_size: int, *, is_causal: bool, layout: str = "zigzag"):
    """The work of every ring step, as ``ring_attention`` runs it (forward and backward).

    Returns ``steps[d][s]``: the kernel call(s) device ``d`` makes at ring step
    ``s`` (when it holds the key/value shard of device ``(d - s) % D``), each a
    tuple of ``(query chunk, key chunk, mask)`` blocks of the global sequence,
    ``mask`` ``"full"`` or ``"causal"`` (the diagonal); ``()`` is a skipped
    step (no kernel call). Chunks are the ``D`` shards for
    ``layout="contiguous"`` (or no causal mask) and the ``2 D`` half-shards
    for ``layout="zigzag"``, where every step after the first is one call of
    two half-by-half blocks (stacked along the batch axis).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    D = int(axis_size)
    steps = []
    for d in range(D):
        row = []
        for s in range(D):
            src = (d - s) % D
            if not is_causal:
                row.append(((d, src, "full"),))
            elif layout == "contiguous":
                row.append(((d, d, "causal"),) if s == 0 else ((d, src, "full"),) if src < d else ())
            else:
                lo, hi = d, 2 * D - 1 - d
                k_lo, k_hi = src, 2 * D - 1 - src
                if s == 0:  # one causal call over the whole shard
                    row.append(((lo, lo, "causal"), (hi, lo, "full"), (hi, hi, "causal")))
                elif src < d:  # both query halves see the early key half
                    row.append(((hi, k_lo, "full"), (lo, k_lo, "full")))
                else:  # the late query half sees both key halves
                    row.append(((hi, k_lo, "full"), (hi, k_hi, "full")))
        steps.append(tuple(row))
    return tuple(steps)


# --- the custom VJP ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _RingConfig:
    axis_name: Any
    axis_size: int
    is_causal: bool
    zigzag: bool  # causal with the zigzag layout (two half-shard blocks per step)
    kernel: KernelConfig  # is_causal=False; the diagonal call replaces it (but with a window)
    windowed: bool = False  # a window: every step one call over all chunk pairs, with offsets
    chunks: int = 1  # chunks per shard (zigzag: 2) where positions matter to the window


# With sinks, the merged (out, lse) become the sink-inclusive ones once, after
# the ring (with_sinks), and the backward ring runs on those: P = exp(logits -
# lse) and delta = rowsum(dO * out) are then the sinks' softmax and its delta,
# as in attention's custom_vjp, so dq, dk, dv need nothing more.
@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _ring(q, k, v, q_ids, kv_ids, sinks, cfg):
    return with_sinks(*_ring_forward(q, k, v, q_ids, kv_ids, cfg), sinks)


def _ring_fwd(q, k, v, q_ids, kv_ids, sinks, cfg):
    out, lse = with_sinks(*_ring_forward(q, k, v, q_ids, kv_ids, cfg), sinks)
    return (out, lse), (q, k, v, q_ids, kv_ids, sinks, out, lse)


def _ring_bwd(cfg, residuals, cotangents):
    q, k, v, q_ids, kv_ids, sinks, out, lse = residuals
    dout, _ = cotangents  # lse leaves ring_attention under stop_gradient
    dout = dout.astype(q.dtype)
    dq, dk, dv = _ring_backward(q, k, v, q_ids, kv_ids, out, lse, dout, cfg)
    if sinks is not None:  # (the steps' kernels do not hand back their delta)
        dsinks = _summed_like(sinks_gradient(lse, row_delta(out, dout, lse.dtype), sinks), sinks)
    else:
        dsinks = None
    return dq, dk, dv, None, None, dsinks


def _summed_like(g, primal):
    """A cotangent summed over the mesh axes it varies over and its primal
    does not: the sinks' gradient from this device's rows, summed over the
    ring's devices (and any batch axis) when the sinks are the same on all
    of them. Where jax does not track varying axes (shard_map with
    check_vma=False, older jax) shard_map's transpose sums the cotangent of
    a replicated input itself."""
    g_axes, primal_axes = _varying_axes(g), _varying_axes(primal)
    if g_axes is None or primal_axes is None:
        return g
    extra = tuple(sorted(g_axes - primal_axes, key=str))
    return lax.psum(g, extra) if extra else g


_ring.defvjp(_ring_fwd, _ring_bwd)


def _ring_perm(cfg):
    return [(i, (i + 1) % cfg.axis_size) for i in range(cfg.axis_size)]


def _send(tree, cfg):
    """One hop around the ring: device i's values go to device i + 1."""
    return jax.tree.map(lambda x: lax.ppermute(x, cfg.axis_name, _ring_perm(cfg)), tree)


def _ring_forward(q, k, v, q_ids, kv_ids, cfg):
    if cfg.windowed:
        return _ring_forward_windowed(q, k, v, q_ids, kv_ids, cfg)
    D = cfg.axis_size
    me = lax.axis_index(cfg.axis_name)
    acc_dtype = jnp.promote_types(q.dtype, jnp.float32)
    c = q.shape[1] // 2
    if cfg.zigzag:
        q_hi = _rows(q, 1, c, c)
        q_ids_hi = None if q_ids is None else _rows(q_ids, 1, c, c)
    kv = (k, v, kv_ids)
    acc = None
    for step in range(D):
        # Sent before this step's kernel call: nothing below waits for it.
        kv_next = _send(kv, cfg) if step < D - 1 else None
        k_s, v_s, ids_s = kv
        if step == 0:  # own shard: the diagonal (or everything, without a mask)
            out, lse = _fwd(q, k_s, v_s, q_ids, ids_s, cfg, causal=cfg.is_causal)
            acc = (out.astype(acc_dtype), lse)
        elif not cfg.is_causal:
            acc = _merge(acc, *_fwd(q, k_s, v_s, q_ids, ids_s, cfg, causal=False))
        elif cfg.zigzag:
            # Source src < me: both query halves see the early key half (chunk
            # src); src > me: the late query half (chunk 2D-1-me) sees both key
            # halves. Either way two full c x c blocks, one of them always
            # (q_hi, k_lo); the other starts at row `off` of both q and k.
            src = (me - step) % D
            off = jnp.where(src < me, 0, c)
            qp = _pair(q_hi, q, off, c)
            kp, vp = (_pair(_rows(x, 1, 0, c), x, off, c) for x in (k_s, v_s))
            qi = None if q_ids is None else _pair(q_ids_hi, q_ids, off, c)
            ki = None if ids_s is None else _pair(_rows(ids_s, 1, 0, c), ids_s, off, c)
            out, lse = _fwd(qp, kp, vp, qi, ki, cfg, causal=False)
            b = q.shape[0]
            acc = _merge_rows(acc, out[:b], lse[:b], c)
            acc = _merge_rows(acc, out[b:], lse[b:], off)
        else:  # contiguous causal: the visiting shard is entirely before or after
            # (a branch per step: on a GPU XLA reads its predicate on the host;
            # the zigzag path above has none).
            src = (me - step) % D

            def visible(acc, k_s=k_s, v_s=v_s, ids_s=ids_s):
                return _merge(acc, *_fwd(q, k_s, v_s, q_ids, ids_s, cfg, causal=False))

            acc = lax.cond(src < me, visible, lambda acc: acc, acc)
        if kv_next is not None:
            kv = kv_next
    out, lse = acc
    return out.astype(q.dtype), lse


def _ring_backward(q, k, v, q_ids, kv_ids, out, lse, dout, cfg):
    if cfg.windowed:
        return _ring_backward_windowed(q, k, v, q_ids, kv_ids, out, lse, dout, cfg)
    D = cfg.axis_size
    me = lax.axis_index(cfg.axis_name)
    acc_dtype = jnp.promote_types(q.dtype, jnp.float32)
    c = q.shape[1] // 2
    b = q.shape[0]
    if cfg.zigzag:
        hi = lambda x, axis=1: None if x is None else _rows(x, axis, c, c)
        q_hi, out_hi, dout_hi, q_ids_hi, lse_hi = hi(q), hi(out), hi(dout), hi(q_ids), hi(lse, 2)

    dq = jnp.zeros_like(q, acc_dtype)
    dkv = (jnp.zeros_like(k, acc_dtype), jnp.zeros_like(v, acc_dtype))
    kv = (k, v, kv_ids)
    for step in range(D):
        kv_next = _send(kv, cfg) if step < D - 1 else None
        k_s, v_s, ids_s = kv
        if step == 0:
            dq_p, dk_p, dv_p = _bwd(q, k_s, v_s, out, lse, dout, q_ids, ids_s, cfg, cfg.is_causal)
            dq = dq + dq_p.astype(acc_dtype)
            dkv = (dkv[0] + dk_p.astype(acc_dtype), dkv[1] + dv_p.astype(acc_dtype))
        elif not cfg.is_causal:
            dq_p, dk_p, dv_p = _bwd(q, k_s, v_s, out, lse, dout, q_ids, ids_s, cfg, False)
            dq = dq + dq_p.astype(acc_dtype)
            dkv = (dkv[0] + dk_p.astype(acc_dtype), dkv[1] + dv_p.astype(acc_dtype))
        elif cfg.zigzag:
            src = (me - step) % D
            off = jnp.where(src < me, 0, c)
            qp, op, dop = (_pair(xh, x, off, c) for xh, x in ((q_hi, q), (out_hi, out), (dout_hi, dout)))
            lp = _pair(lse_hi, lse, off, c, axis=2)
            kp, vp = (_pair(_rows(x, 1, 0, c), x, off, c) for x in (k_s, v_s))
            qi = None if q_ids is None else _pair(q_ids_hi, q_ids, off, c)
            ki = None if ids_s is None else _pair(_rows(ids_s, 1, 0, c), ids_s, off, c)
            dq_p, dk_p, dv_p = _bwd(qp, kp, vp, op, lp, dop, qi, ki, cfg, False)
            dq = _add_rows(dq, dq_p[:b], c)
            dq = _add_rows(dq, dq_p[b:], off)
            dkv = tuple(
                _add_rows(_add_rows(acc, p[:b], 0), p[b:], off) for acc, p in zip(dkv, (dk_p, dv_p))
            )
        else:
            src = (me - step) % D

            def visible(k_s=k_s, v_s=v_s, ids_s=ids_s):
                return _bwd(q, k_s, v_s, out, lse, dout, q_ids, ids_s, cfg, False)

            def hidden(k_s=k_s, v_s=v_s):
                zeros = (jnp.zeros_like(x) for x in (q, k_s, v_s))
                return tuple(_compat.vary_like(z, x, _varying_axes) for z, x in zip(zeros, (q, k_s, v_s)))

            # The branches return partials, not the travelling sums, so the
            # kernel call does not wait for the accumulators' hop.
            dq_p, dk_p, dv_p = lax.cond(src < me, visible, hidden)
            dq = dq + dq_p.astype(acc_dtype)
            dkv = (dkv[0] + dk_p.astype(acc_dtype), dkv[1] + dv_p.astype(acc_dtype))
        if kv_next is not None:
            kv = kv_next
        # The sums travel with their K/V shard (sent after this step's adds,
        # received by the next step's adds, which come after its kernel call);
        # after the last step device d holds those of shard d + 1, so this
        # last hop brings each home.
        if D > 1:
            dkv = _send(dkv, cfg)
    dk, dv = dkv
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# --- windows: every chunk pair with its position offset ---------------------


def _chunk_starts(device, cfg, length):
    """Global start positions of the shard's chunks (``length`` positions each)."""
    if cfg.chunks == 1:
        return (device * length,)
    return (device * length, (2 * cfg.axis_size - 1 - device) * length)


def _chunk_pairs(me, src, cfg, c):
    """(query chunk, key chunk, offset) of every pair of the two shards: the
    offset is the query chunk's global start minus the key chunk's (traced)."""
    q_starts, k_starts = _chunk_starts(me, cfg, c), _chunk_starts(src, cfg, c)
    return [(a, b, q_starts[a] - k_starts[b]) for a in range(cfg.chunks) for b in range(cfg.chunks)]


def _stack_chunks(x, picks, c, axis=1):
    """Chunks ``picks`` of x (``c`` rows each along ``axis``) stacked along the batch axis."""
    if x is None:
        return None
    return jnp.concatenate([lax.slice_in_dim(x, i * c, (i + 1) * c, axis=axis) for i in picks], axis=0)


def _pair_offsets(pairs, b):
    """The [len(pairs) * b] int32 position offsets of a stacked call."""
    return jnp.concatenate([jnp.full((b,), off, jnp.int32) for _, _, off in pairs])


def _ring_forward_windowed(q, k, v, q_ids, kv_ids, cfg):
    D = cfg.axis_size
    me = lax.axis_index(cfg.axis_name)
    acc_dtype = jnp.promote_types(q.dtype, jnp.float32)
    b, c = q.shape[0], q.shape[1] // cfg.chunks
    # Rows start empty (0, -inf): _merge keeps a row no pair reached that way.
    acc = (jnp.zeros(q.shape, acc_dtype), jnp.full((b, q.shape[2], q.shape[1]), -jnp.inf, acc_dtype))
    kv = (k, v, kv_ids)
    for step in range(D):
        kv_next = _send(kv, cfg) if step < D - 1 else None
        k_s, v_s, ids_s = kv
        pairs = _chunk_pairs(me, (me - step) % D, cfg, c)
        qa, kb = [a for a, _, _ in pairs], [b_ for _, b_, _ in pairs]
        out, lse = _fwd(_stack_chunks(q, qa, c), _stack_chunks(k_s, kb, c), _stack_chunks(v_s, kb, c),
                        _stack_chunks(q_ids, qa, c), _stack_chunks(ids_s, kb, c), cfg,
                        causal=cfg.is_causal, offsets=_pair_offsets(pairs, b))
        for i, (a, _, _) in enumerate(pairs):
            acc = _merge_rows(acc, out[i * b:(i + 1) * b], lse[i * b:(i + 1) * b], a * c)
        if kv_next is not None:
            kv = kv_next
    out, lse = acc
    return out.astype(q.dtype), lse


def _ring_backward_windowed(q, k, v, q_ids, kv_ids, out, lse, dout, cfg):
    D = cfg.axis_size
    me = lax.axis_index(cfg.axis_name)
    acc_dtype = jnp.promote_types(q.dtype, jnp.float32)
    b, c = q.shape[0], q.shape[1] // cfg.chunks
    dq = jnp.zeros_like(q, acc_dtype)
    dkv = (jnp.zeros_like(k, acc_dtype), jnp.zeros_like(v, acc_dtype))
    kv = (k, v, kv_ids)
    for step in range(D):
        kv_next = _send(kv, cfg) if step < D - 1 else None
        k_s, v_s, ids_s = kv
        pairs = _chunk_pairs(me, (me - step) % D, cfg, c)
        qa, kb = [a for a, _, _ in pairs], [b_ for _, b_, _ in pairs]
        dq_p, dk_p, dv_p = _bwd(
            _stack_chunks(q, qa, c), _stack_chunks(k_s, kb, c), _stack_chunks(v_s, kb, c),
            _stack_chunks(out, qa, c), _stack_chunks(lse, qa, c, axis=2), _stack_chunks(dout, qa, c),
            _stack_chunks(q_ids, qa, c), _stack_chunks(ids_s, kb, c), cfg, cfg.is_causal,
            offsets=_pair_offsets(pairs, b))
        for i, (a, b_, _) in enumerate(pairs):
            rows = slice(i * b, (i + 1) * b)
            dq = _add_rows(dq, dq_p[rows], a * c)
            dkv = (_add_rows(dkv[0], dk_p[rows], b_ * c), _add_rows(dkv[1], dv_p[rows], b_ * c))
        if kv_next is not None:
            kv = kv_next
        if D > 1:  # the sums travel with their K/V shard (see _ring_backward)
            dkv = _send(dkv, cfg)
    dk, dv = dkv
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# --- per-call helpers ---------------------------------------------------------


def _feature_operands(q_ids, kv_ids, acc_dtype, offsets=None):
    """The NUM_FEATURE_OPERANDS kernel operands: placeholders but for segment
    ids and (with a window) the position offsets."""
    operands = [
        jnp.zeros((1, 1, 1, 1), acc_dtype),  # bias
        jnp.ones((1, 1, 1, 1), jnp.bool_),  # mask
        jnp.zeros((1,), jnp.int32),  # q_seqlens
        jnp.zeros((1,), jnp.int32),  # kv_seqlens
    ]
    if q_ids is not None:
        operands += [q_ids, kv_ids, segment_block_ranges(q_ids), segment_block_ranges(kv_ids)]
    else:
        operands += [jnp.zeros((1, 1), jnp.int32)] * 4
    operands.append(jnp.zeros((1,), jnp.uint32))  # dropout seed
    operands.append(jnp.zeros((1,), jnp.int32) if offsets is None else offsets)
    assert len(operands) == NUM_FEATURE_OPERANDS
    return operands


def _static(cfg, causal):
    return dataclasses.replace(cfg.kernel, is_causal=bool(causal))


def _fwd(q, k, v, q_ids, kv_ids, cfg, causal, offsets=None):
    ops = _feature_operands(q_ids, kv_ids, jnp.promote_types(q.dtype, jnp.float32), offsets)
    return _forward_call(q, k, v, ops, _static(cfg, causal))


def _bwd(q, k, v, out, lse, dout, q_ids, kv_ids, cfg, causal, offsets=None):
    ops = _feature_operands(q_ids, kv_ids, jnp.promote_types(q.dtype, jnp.float32), offsets)
    return _backward_call(q, k, v, out, lse, dout, ops, _static(cfg, causal))[:3]


def _rows(x, axis, start, size):
    """x[..., start:start + size, ...] along `axis`; `start` may be traced."""
    return lax.dynamic_slice_in_dim(x, start, size, axis=axis)


def _pair(first, x, off, c, axis=1):
    """[first; x rows off:off+c] stacked along the batch axis (one kernel call)."""
    return jnp.concatenate([first, _rows(x, axis, off, c)], axis=0)


def _merge(acc, out, lse):
    """Two partial softmax results of the same rows combined by their logsumexp.

    acc = (o [B, T, N, H], l [B, N, T]) in the accumulation dtype; (out, lse)
    one kernel call's. Rows that saw no key have l = -inf and o = 0; where
    both are -inf the merged row stays (0, -inf) instead of NaN.
    """
    o_acc, l_acc = acc
    lse = lse.astype(l_acc.dtype)
    m = jnp.maximum(l_acc, lse)
    m = jnp.where(jnp.isneginf(m), 0.0, m)
    w_acc, w_new = jnp.exp(l_acc - m), jnp.exp(lse - m)
    total = w_acc + w_new
    l_out = m + jnp.log(total)  # -inf where both are empty
    inv = jnp.where(total > 0, 1.0 / jnp.where(total > 0, total, 1.0), 0.0)
    # [B, N, T] weights onto [B, T, N, H] rows.
    a = jnp.swapaxes(w_acc * inv, 1, 2)[..., None]
    n = jnp.swapaxes(w_new * inv, 1, 2)[..., None]
    o_out = o_acc * a + out.astype(o_acc.dtype) * n
    return o_out, l_out


def _merge_rows(acc, out, lse, start):
    """_merge of a block of rows start:start + rows of the accumulator."""
    o_acc, l_acc = acc
    rows = out.shape[1]
    part = _merge((_rows(o_acc, 1, start, rows), _rows(l_acc, 2, start, rows)), out, lse)
    return (
        lax.dynamic_update_slice_in_dim(o_acc, part[0], start, axis=1),
        lax.dynamic_update_slice_in_dim(l_acc, part[1], start, axis=2),
    )


def _add_rows(acc, x, start):
    rows = x.shape[1]
    block = _rows(acc, 1, start, rows) + x.astype(acc.dtype)
    return lax.dynamic_update_slice_in_dim(acc, block, start, axis=1)


# --- argument checks ----------------------------------------------------------


def _axis_size(axis_name) -> int:
    try:
        if hasattr(lax, "axis_size"):
            size = lax.axis_size(axis_name)
        else:  # older jax: psum of a constant is the (static) axis size
            size = lax.psum(1, axis_name)
        return int(size)
    except NameError:
        raise ValueError(
            f"axis_name {axis_name!r} is not a bound mesh axis: call ring_attention inside "
            f"shard_map with the sequence axis of query, key and value sharded over it"
        ) from None


def _varying_axes(x):
    """The manual mesh axes x varies over, or None where jax does not track them."""
    try:
        from jax._src import config as _config

        if not _config._check_vma.value:  # shard_map(check_vma=False): untracked
            return None
    except (ImportError, AttributeError):
        return None
    aval = _compat.typeof(x)
    manual = getattr(aval, "manual_axis_type", None) or getattr(aval, "mat", None)
    if manual is not None and hasattr(manual, "varying"):
        return frozenset(manual.varying)
    vma = getattr(aval, "vma", None)
    return None if vma is None else frozenset(vma)


def _check_sharded(name, x, axis_name):
    varying = _varying_axes(x)
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    if varying is not None and not set(names) <= varying:
        raise ValueError(
            f"{name} is not sharded over the mesh axis {axis_name!r} (it is the same on every "
            f"device of the ring): give its sequence axis the spec {axis_name!r} in shard_map"
        )
