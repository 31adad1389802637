"""The custom VJP around jax_flash's FFI targets, and the calls themselves."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash import _decode_scratch
from jax_flash import _partitioning as part
from jax_flash import _compat, _registration

# Bits of the FFI `features` attribute (ffi/common/ffi_decode.h FeatureBits).
HAS_BIAS, HAS_MASK, HAS_Q_SEQLENS, HAS_KV_SEQLENS, HAS_SEGMENTS = 1, 2, 4, 8, 16
DROPOUT_SHARED = 32
HAS_SEGMENT_RANGES = 64
HAS_POSITION_OFFSETS = 128  # query positions shifted against the keys (ring attention)
HAS_MASK_BLOCKS = 256  # the mask_blocks operand is a per-query mask's block summary
HAS_SINKS = 512  # the forward's sinks operand is real (its epilogues add them: ffi/common/row_end.h)
# Positions per entry of the segment-id block summaries (ffi/common/params.h kSegmentBlock).
SEGMENT_BLOCK = 64
# Queries and keys per entry of a boolean mask's block summary (params.h kMaskBlock).
MASK_BLOCK = 64


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Everything compiled into the kernel call (hashable: a nondiff argument)."""

    scale: float
    is_causal: bool
    implementation: int
    features: int
    window_left: int
    window_right: int
    softcap: float
    dropout_rate: float
    deterministic: bool = False

    def attributes(self) -> dict:
        # Typed NumPy scalars matching the handlers' Attr types.
        return dict(
            scale=np.float64(self.scale),
            is_causal=np.int32(self.is_causal),
            implementation=np.int32(self.implementation),
            features=np.int32(self.features),
            window_left=np.int64(self.window_left),
            window_right=np.int64(self.window_right),
            softcap=np.float64(self.softcap),
            dropout_rate=np.float64(self.dropout_rate),
            deterministic=np.int32(self.deterministic),
        )


# --- custom VJP -----------------------------------------------------------
# Primal arguments: q, k, v, sinks (float [N] or None), then the feature
# operands (bias, mask, q_seqlens, kv_seqlens, q_segment_ids,
# kv_segment_ids, q_segment_ranges, kv_segment_ranges, dropout_seed,
# position_offsets; placeholders when unused), then the KernelConfig.
NUM_FEATURE_OPERANDS = 10


@functools.partial(jax.custom_vjp, nondiff_argnums=(4 + NUM_FEATURE_OPERANDS,))
def flash_attention(q, k, v, sinks, *rest):
    *feature_ops, static = rest
    return _forward_call(q, k, v, feature_ops, static, sinks)


def _flash_attention_fwd(q, k, v, sinks, *rest):
    *feature_ops, static = rest
    out, lse = _forward_call(q, k, v, feature_ops, static, sinks)
    return (out, lse), (q, k, v, sinks, out, lse, tuple(feature_ops))


def _flash_attention_bwd(static, residuals, cotangents):
    q, k, v, sinks, out, lse, feature_ops = residuals
    dout, _ = cotangents  # lse leaves attention() under stop_gradient
    dout = dout.astype(q.dtype)
    # With sinks, out and lse are the sink-inclusive ones (the forward's
    # epilogues add the sinks): the kernels' P = exp(logits - lse) and delta
    # = rowsum(dO * out) are then the sinks' softmax and its delta, and dq,
    # dk, dv, dbias need nothing more.
    dq, dk, dv, delta = _backward_call(q, k, v, out, lse, dout, feature_ops, static)
    bias = feature_ops[0]
    if static.features & HAS_BIAS:
        # A separate call, so that XLA drops it when nobody uses the bias gradient.
        dbias = _bias_gradient_call(q, k, v, out, lse, dout, feature_ops, static)
    else:
        dbias = jnp.zeros_like(bias)
    # With explicit sharding a cotangent must have its primal's type; where the
    # rules ran the call on other shardings (_partitioning.py), reshard back.
    dq, dk, dv, dbias = (
        part.like_type(g, x) for g, x in ((dq, q), (dk, k), (dv, v), (dbias, bias))
    )
    dsinks = None if sinks is None else part.like_type(sinks_gradient(lse, delta, sinks), sinks)
    # Integer and bool operands (mask, lengths, segments, seed) get no cotangent.
    return (dq, dk, dv, dsinks, dbias) + (None,) * (len(feature_ops) - 1)


def with_sinks(out, lse, sinks):
    """(out, lse) of attention whose every row's softmax also counts one
    logit per query head, ``sinks`` [N] (attention sinks, gpt-oss), with no
    value: lse' = logaddexp(lse, sink), out' = out * exp(lse - lse'). out
    [..., T, N, H], lse [..., N, T] in the row statistics' float type; a row
    with no visible key (lse -inf) stays zero, its lse' the sink. A pass over
    out, for the results of calls that merge partial (out, lse) first (ring
    attention, after its merge; paged attention's decode kernels): the
    forward kernels take the sinks in their epilogues (_forward_call).
    Unchanged when sinks is None."""
    if sinks is None:
        return out, lse
    sink = sinks.astype(lse.dtype)[:, None]  # [N, 1] against [..., N, T]
    lse_sinks = jnp.logaddexp(lse, sink)
    factor = jnp.where(lse == -jnp.inf, 0.0, jnp.exp(lse - lse_sinks))
    out = (out.astype(lse.dtype) * jnp.swapaxes(factor, -1, -2)[..., None]).astype(out.dtype)
    return out, lse_sinks


def sinks_gradient(lse, delta, sinks):
    """d loss / d sinks [N]: the sink column's dS = P_sink (0 - delta) (its
    value is zero, so dP_sink = 0), summed over batch and rows, from the
    sink-inclusive lse and delta = rowsum(dO * out) of the sink-inclusive
    out, both [..., N, T] (the backward call returns its delta; row_delta
    makes one)."""
    stats = lse.dtype
    # (lse -inf only where the row and its sink both are: no share there.)
    p_sink = jnp.exp(sinks.astype(stats)[:, None] - lse)  # [..., N, T]
    per_row = jnp.where(lse == -jnp.inf, 0.0, p_sink * delta.astype(stats))
    return (-jnp.sum(per_row.reshape((-1,) + per_row.shape[-2:]), axis=(0, 2))).astype(sinks.dtype)


def row_delta(out, dout, stats):
    """delta = rowsum(dO * out) as [..., N, T] in `stats`, for callers whose
    backward kernels do not hand theirs back (ring attention's steps)."""
    return jnp.swapaxes(jnp.sum(dout.astype(stats) * out.astype(stats), axis=-1), -1, -2)


flash_attention.defvjp(_flash_attention_fwd, _flash_attention_bwd)


# --- FFI calls --------------------------------------------------------------
# vmap_method="broadcast_all" gives the handlers inputs with extra leading
# (batch) dims, which they fold into batch.


def _result_type(like: jax.Array, shape, dtype):
    """The type of an FFI result, derived from the input `like`.

    ffi_call outputs take exactly the type we declare. Inside shard_map a
    result must vary over the same manual mesh axes as the inputs (else the
    custom VJP's cotangent types stop matching the primal's), so the result
    is `like`'s abstract value with a new shape and dtype, keeping its mesh.
    """
    aval = _compat.typeof(like)
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


def _row_stats_type(q: jax.Array):
    """lse/delta: [..., N, T], float32 (float64 for float64 inputs)."""
    *batch, t, n, _ = q.shape
    return _result_type(q, (*batch, n, t), jnp.promote_types(q.dtype, jnp.float32))


def _forward_call(q, k, v, feature_ops, static, sinks=None):
    """out [..., T, N, H] and lse [..., N, T]: one forward call, partitioned
    by the rules of _partitioning.py under jit over a mesh (as is inside
    shard_map or on one device). sinks: float [N] in the row statistics'
    type, added by the kernels' epilogues (out and lse then sink-inclusive,
    as with_sinks would make them), or None."""
    if sinks is None:
        return _FORWARD(static, q, k, v, *feature_ops, _no_sinks(q))
    static = dataclasses.replace(static, features=static.features | HAS_SINKS)
    return _FORWARD(static, q, k, v, *feature_ops, sinks)


def _no_sinks(q):
    """The sinks operand's placeholder (one element of the accumulator's type)."""
    return jnp.zeros((1,), jnp.promote_types(q.dtype, jnp.float32))


@functools.lru_cache(maxsize=None)
def _gpu_takes_16bit_bias() -> bool:
    """Whether this build's CUDA kernels read a 16-bit bias as 16-bit (and
    write dbias in its dtype): the extension says so in build_info (every
    CUDA build since session 19, when they were verified on the H200). An
    extension without the flag (built from older sources) gets the float32
    path of before: the GPU branch of each call up-casts a 16-bit bias and
    casts dbias back; the CPU takes it as it is."""
    return bool(_registration.build_info().get("cuda_bias_16bit", False))


def _gpu_upcasts_bias(feature_ops, static) -> bool:
    """Whether the GPU branch must up-cast a 16-bit bias (kernels that read
    float32 only): then the CPU and GPU branches differ."""
    bias = feature_ops[0]
    return bool(static.features & HAS_BIAS) and bias.dtype != jnp.float32 and not _gpu_takes_16bit_bias()


def _gpu_feature_ops(feature_ops, static):
    """The feature operands as the GPU branch passes them. Called inside that
    branch, so that the CPU's lowering holds no convert of the bias at all."""
    if not _gpu_upcasts_bias(feature_ops, static):
        return feature_ops
    return (feature_ops[0].astype(jnp.float32), *feature_ops[1:])


def mask_block_summary(mask: jax.Array) -> jax.Array:
    """uint8 ``[..., ceil(T / 64), ceil(S / 64)]`` of a boolean mask ``[..., T, S]``:
    bit 0 where the entry's 64 queries x 64 keys have a visible pair, bit 1
    where all of them are visible (pairs past T or S count as neither).

    The CUDA kernels' block classification of a per-query mask
    (ffi/common/mask_policy.h MaskBlocks): a block the mask hides whole is
    skipped (the Hopper forward trims a tile's key blocks, the backward a key
    block's query steps), one it shows whole needs no mask bytes read, and
    only the others read the mask pair by pair. One pass over the mask per
    call, inside the call's per-shard body (the GPU branch only): each
    entry's count of visible pairs as one int32 sum, over the entry's 64
    queries (a column reduction) and then its 64 keys (a row reduction),
    compared with 0 and with the entry's pairs inside T x S. Measured on the
    H200 (scripts/time_mask_summary.py, session 26): 47.6 us for a
    [2, 4, 4096, 4096] mask (near its read at HBM speed), where two boolean
    reductions (any of the mask and of its negation) took 220 us; 42 against
    59 us at [1, 1, 4096, 4096], 52 against 42 at [1, 1, 1000, 3000].
    """
    *lead, t, s = mask.shape
    tb, sb = -(-t // MASK_BLOCK), -(-s // MASK_BLOCK)
    config = [(0, 0, 0)] * len(lead) + [(0, tb * MASK_BLOCK - t, 0), (0, sb * MASK_BLOCK - s, 0)]
    x = jax.lax.pad(mask.astype(jnp.int32), jnp.int32(0), config)
    per_key = x.reshape(*lead, tb, MASK_BLOCK, sb * MASK_BLOCK).sum(axis=-2)
    count = per_key.reshape(*lead, tb, sb, MASK_BLOCK).sum(axis=-1)
    rows = jnp.minimum(t - MASK_BLOCK * jnp.arange(tb), MASK_BLOCK)[:, None]
    cols = jnp.minimum(s - MASK_BLOCK * jnp.arange(sb), MASK_BLOCK)[None, :]
    some = count > 0
    every = count == rows * cols
    return some.astype(jnp.uint8) | (every.astype(jnp.uint8) << 1)


def _takes_mask_blocks(q, k, feature_ops, static) -> bool:
    """Whether the GPU branch passes the mask's block summary: a boolean mask
    per query and per key (its last two dims T and S; key-only masks are
    summarized by the kernels' own votes), outside the generic kernels."""
    mask = feature_ops[1]
    return (
        bool(static.features & HAS_MASK)
        and static.implementation != 1  # "generic": reads the mask only
        and mask.ndim >= 2
        and mask.shape[-2] == q.shape[-3]
        and mask.shape[-1] == k.shape[-3]
        and q.shape[-3] > 1
    )


def _mask_blocks(q, k, feature_ops, static, on_gpu: bool):
    """The mask_blocks operand and the features attribute of one FFI call:
    the summary (mask_block_summary) on the GPU where _takes_mask_blocks,
    else a one-element placeholder (the CPU skips hidden blocks by its own
    scan, MaskArrayHidesBlock)."""
    if on_gpu and _takes_mask_blocks(q, k, feature_ops, static):
        return mask_block_summary(feature_ops[1]), static.features | HAS_MASK_BLOCKS
    return jnp.zeros((1,), jnp.uint8), static.features


def _attributes(static, features: int) -> dict:
    attrs = static.attributes()
    attrs["features"] = np.int32(features)
    return attrs


def _per_platform(cpu, gpu, split: bool):
    """cpu() on the CPU and gpu() elsewhere, or gpu() alone when the two
    branches are the same computation (split False): no platform_dependent
    then, so nothing changes for calls whose operands agree."""
    if not split:
        return gpu()
    return jax.lax.platform_dependent(cpu=cpu, default=gpu)


def _ffi_forward(q, k, v, feature_ops, sinks, static):
    def call(scratch, feature_ops, on_gpu):
        mask_blocks, features = _mask_blocks(q, k, feature_ops, static, on_gpu)
        result_types = (
            _result_type(q, q.shape, q.dtype),  # out
            _row_stats_type(q),  # lse
            _result_type(q, (max(scratch, 1),), jnp.float32),  # the decode path's partials (scratch)
        )
        ffi = jax.ffi.ffi_call(_registration.FWD_TARGET, result_types, vmap_method="broadcast_all")
        out, lse, _ = ffi(q, k, v, *feature_ops, mask_blocks, sinks, **_attributes(static, features))
        return out, lse

    scratch = _decode_scratch.forward_scratch_floats(q.shape, k.shape, q.dtype, static.implementation)
    # A few queries over many keys: the CUDA split-KV decode kernels' partials; the CPU needs none.
    return _per_platform(
        lambda: call(0, feature_ops, on_gpu=False),
        lambda: call(scratch, _gpu_feature_ops(feature_ops, static), on_gpu=True),
        split=bool(scratch)
        or _gpu_upcasts_bias(feature_ops, static)
        or _takes_mask_blocks(q, k, feature_ops, static),
    )


def _uses_dq_accumulator(q, static) -> bool:
    """Whether the CUDA backward can run fused, adding dQ into a float32 buffer.

    Mirrors the dispatch in ffi/cuda/handlers.cu (mma.sync backward: 16-bit
    inputs, head dim a multiple of 8 up to 256); where this says no, the
    handler gets an empty buffer and runs the deterministic backward (two
    passes on the tensor cores up to head dim 128, the generic kernels above).
    """
    head_dim = q.shape[-1]
    return (
        not static.deterministic
        and static.implementation != 1  # "generic"
        and q.dtype in (jnp.float16, jnp.bfloat16)
        and head_dim % 8 == 0
        and head_dim <= 256
    )


@functools.lru_cache(maxsize=None)
def _gpu_has_sm90_deterministic_backward() -> bool:
    """Whether this build's CUDA kernels include the deterministic sm90
    backward (build_info's flag: a CUDA build with sm_90a since session 21)."""
    return bool(_registration.build_info().get("cuda_sm90_deterministic_backward", False))


def _takes_sm90_deterministic_scratch(q, static) -> bool:
    """Whether a deterministic backward gets the deterministic sm90
    backward's scratch (deterministic_scratch_floats).

    Mirrors ffi/cuda/handlers.cu's Sm90DeterministicScratch at trace time,
    without a GPU: a build with those kernels, "auto" or "sm90", 16-bit
    inputs, a head dim that is a multiple of 8 up to 256, a positive scale,
    and a plain call (no bias, mask, lengths, segments, window, position
    offsets, soft cap or dropout; causal or not). The device is not known
    here: where it is not a 9.x GPU the handler ignores the scratch and runs
    the two-pass backward, as it does for every other deterministic call.
    """
    head_dim = q.shape[-1]
    return (
        static.deterministic
        and static.implementation in (0, 3)  # "auto" (None), "sm90"
        and q.dtype in (jnp.float16, jnp.bfloat16)
        and head_dim % 8 == 0
        and head_dim <= 256
        and static.scale > 0
        and static.features == 0
        and static.window_left < 0
        and static.window_right < 0
        and not static.softcap > 0
        and not static.dropout_rate > 0
        and _gpu_has_sm90_deterministic_backward()
    )


# Fewest query rows per counter of the deterministic sm90 backward
# (DeterministicCounterCount, ffi/cuda/sm90/bwd_launch.cuh: its schedule's
# kBlockM, 128 at head dim 64 and 64 at 128 and 256; none has fewer than 64).
_DETERMINISTIC_COUNTER_ROWS = 64


def deterministic_scratch_floats(q_shape) -> int:
    """Float32 elements of the deterministic sm90 backward's scratch, the
    backward's dq_accum result: the dQ accumulator (batch x heads x seqlen_q
    x head_dim floats, as the default backward's), rounded up to 16 bytes,
    then one int32 counter per (batch, head, 64 query rows), at least the
    handler's sm90::DeterministicCounters. Linear in the batch, so that
    vmap's stacked copies of it (broadcast_all: a leading dim on every
    result) hold the folded batch's. Cost beyond the two-pass backward: the
    accumulator, 4 B x H per query row and head (twice q's bytes in 16 bits;
    where the device is not Hopper it goes unused), plus 4 B per 64 rows."""
    *batch, t, n, h = q_shape
    rows = math.prod(batch) * n
    accum = -(-(rows * t * h) // 4) * 4
    return accum + rows * -(-t // _DETERMINISTIC_COUNTER_ROWS)


def _backward_call(q, k, v, out, lse, dout, feature_ops, static):
    """dq, dk, dv and delta = rowsum(dO * out) [..., N, T], which every
    family's backward computes first (the sinks' gradient reads it): one
    backward call (partitioned like _forward_call)."""
    return _BACKWARD(static, q, k, v, out, lse, dout, *feature_ops)


def _ffi_backward(q, k, v, out, lse, dout, feature_ops, static):
    def call(k, v, accum_shape, feature_ops, on_gpu=True):
        mask_blocks, features = _mask_blocks(q, k, feature_ops, static, on_gpu)
        result_types = (
            _result_type(q, q.shape, q.dtype),  # dq
            _result_type(k, k.shape, k.dtype),  # dk
            _result_type(v, v.shape, v.dtype),  # dv
            _row_stats_type(q),  # delta (scratch)
            _result_type(q, accum_shape, jnp.float32),  # dq_accum (scratch)
        )
        ffi = jax.ffi.ffi_call(_registration.BWD_TARGET, result_types, vmap_method="broadcast_all")
        dq, dk, dv, delta, _ = ffi(q, k, v, out, lse, dout, *feature_ops, mask_blocks, _no_sinks(q),
                                   **_attributes(static, features))
        return dq, dk, dv, delta

    cpu = lambda: call(k, v, (0,), feature_ops, on_gpu=False)  # noqa: E731
    if _takes_sm90_deterministic_scratch(q, static):
        # Plain 16-bit calls (no feature operands to up-cast): one flat
        # float32 buffer on the GPU, none on the CPU. No key head copies:
        # their dk, dv sums would be one more reduction to keep in order.
        scratch = (deterministic_scratch_floats(q.shape),)
        return jax.lax.platform_dependent(cpu=cpu, default=lambda: call(k, v, scratch, feature_ops))
    if not _uses_dq_accumulator(q, static):
        return _per_platform(
            cpu,
            lambda: call(k, v, (0,), _gpu_feature_ops(feature_ops, static)),
            split=_gpu_upcasts_bias(feature_ops, static) or _takes_mask_blocks(q, k, feature_ops, static),
        )
    # [..., N, T, H] float32 for the GPU's fused backward; the CPU never needs it.
    *batch, t, n, h = q.shape

    def gpu():
        copies = key_head_copies(q.shape, k.shape, _multiprocessors())
        gpu_ops = _gpu_feature_ops(feature_ops, static)
        return with_key_head_copies(lambda k, v: call(k, v, (*batch, n, t, h), gpu_ops), k, v, copies)

    return jax.lax.platform_dependent(cpu=cpu, default=gpu)


# The GPU backward runs one block per (key block, key head, batch), which
# loops over the key head's group of query heads: with GQA and few key
# blocks that is few, long blocks (GQA 16:2, B=4, T=4096: 256 of them for
# 132 multiprocessors; causal ones of very unequal length), and the backward
# ran at 0.74x of the same shape's MHA speed per FLOP (v17, H200). Giving each
# key head `copies` copies, each serving G / copies of the group's query
# heads, multiplies the blocks; the copies' dK and dV are summed after.
_TARGET_BLOCKS_PER_SM = 4  # ~two waves of two co-resident blocks: the LPT order then balances


def _key_block(head_dim: int) -> int:
    """Keys per backward block: 128 up to head dim 128, 64 beyond (sm80's
    fused backward and sm90's Bwd256Traits, at the head dims rounded up to
    256)."""
    return 128 if head_dim <= 128 else 64


def _multiprocessors() -> int:
    """The GPU's multiprocessor count (132 on an H200), or 132 where none is visible."""
    try:
        return int(jax.devices("gpu")[0].core_count)
    except Exception:  # no GPU backend at trace time (lowering the CPU branch), or no such attribute
        return 132


def key_head_copies(q_shape, k_shape, multiprocessors: int) -> int:
    """How many copies of each key head the backward should run with: the
    smallest divisor of the group size G = N / K that gives at least
    _TARGET_BLOCKS_PER_SM blocks per multiprocessor (G if none does); 1 for
    MHA or when the key blocks already suffice. Extra memory: `copies` times
    k, v, dk and dv, bounded because copies > 1 only for few key blocks."""
    *batch, s, kv_heads, head_dim = k_shape
    group = q_shape[-2] // kv_heads
    blocks = math.prod(batch) * kv_heads * -(-s // _key_block(head_dim))
    target = _TARGET_BLOCKS_PER_SM * multiprocessors
    if group == 1 or blocks >= target:
        return 1
    for copies in range(2, group + 1):
        if group % copies == 0 and blocks * copies >= target:
            return copies
    return group


def with_key_head_copies(backward, k, v, copies: int):
    """backward(k, v) -> (dq, dk, dv, *rest) run on `copies` copies of each
    key head (head hk * copies + c is key head hk: query head h then maps to
    copy h // (G / copies), its own group's share), dk and dv summed over the
    copies in float32 and rounded once (the rest, per query row, as it is)."""
    if copies == 1:
        return backward(k, v)
    dq, dk, dv, *rest = backward(jnp.repeat(k, copies, axis=-2), jnp.repeat(v, copies, axis=-2))

    def fold(g, like):
        *lead, kv_heads, h = like.shape
        summed = g.reshape(*lead, kv_heads, copies, h).sum(axis=-2, dtype=jnp.promote_types(g.dtype, jnp.float32))
        return summed.astype(like.dtype)

    return (dq, fold(dk, k), fold(dv, v), *rest)


def _bias_gradient_call(q, k, v, out, lse, dout, feature_ops, static):
    """dbias in the bias's shape (partitioned like _forward_call; a bias
    broadcast along a split dim gets its shards' gradients summed)."""
    (dbias,) = _BIAS_GRADIENT(static, q, k, v, out, lse, dout, *feature_ops)
    return dbias


def dbias_accumulator_shape(bias_shape, q_shape, k_shape, bias_dtype, on_gpu: bool):
    """The float32 scratch of the CUDA bias gradient: the bias's shape when
    a 16-bit bias is broadcast along some dim (its dS sums over batch entries,
    heads, queries or keys by float32 atomics, rounded into dbias once at the
    end), else one element: a bias of the full [..., N, T, S] shape has each
    gradient element written by one thread, and a float32 one is summed in
    place. The CPU sums in its own buffers and never needs it."""
    *lead, t, n, _ = q_shape
    full = (*lead, n, t, k_shape[-3])
    if on_gpu and jnp.dtype(bias_dtype) != jnp.float32 and tuple(bias_shape) != full:
        return tuple(bias_shape)
    return (1,)


def _ffi_bias_gradient(q, k, v, out, lse, dout, feature_ops, static):
    def call(feature_ops, on_gpu):
        mask_blocks, features = _mask_blocks(q, k, feature_ops, static, on_gpu)
        bias = feature_ops[0]
        accum = dbias_accumulator_shape(bias.shape, q.shape, k.shape, bias.dtype, on_gpu)
        result_types = (
            _result_type(bias, bias.shape, bias.dtype),  # dbias, the bias's dtype
            _row_stats_type(q),  # delta (scratch)
            _result_type(bias, accum, jnp.float32),  # dbias_accum (scratch)
        )
        ffi = jax.ffi.ffi_call(_registration.DBIAS_TARGET, result_types, vmap_method="broadcast_all")
        dbias, _, _ = ffi(q, k, v, out, lse, dout, *feature_ops, mask_blocks, _no_sinks(q),
                          **_attributes(static, features))
        return dbias

    bias = feature_ops[0]
    return _per_platform(
        lambda: call(feature_ops, on_gpu=False),
        lambda: call(_gpu_feature_ops(feature_ops, static), on_gpu=True).astype(bias.dtype),
        split=_gpu_upcasts_bias(feature_ops, static)
        or dbias_accumulator_shape(bias.shape, q.shape, k.shape, bias.dtype, True) != (1,)
        or _takes_mask_blocks(q, k, feature_ops, static),
    )


# --- partitioning rules (_partitioning.py) -----------------------------------
# Each dim of each operand gets a role: "b<i>" (leading dim i of q), heads
# ("n" query, "k" key: split together), or one that is never split ("t", "s",
# "h", None). Optional operands follow their own broadcast dims.


def _q_roles(nl):
    return tuple(part.lead(i) for i in range(nl)) + (part.SEQ_Q, part.HEADS_Q, part.HEAD_DIM)


def _k_roles(nl):
    return tuple(part.lead(i) for i in range(nl)) + (part.SEQ_K, part.HEADS_K, part.HEAD_DIM)


def _stats_roles(nl):
    return tuple(part.lead(i) for i in range(nl)) + (part.HEADS_Q, part.SEQ_Q)


def _matching(shape, roles, sizes):
    """roles where shape has the full size, None where it is broadcast (1)."""
    if len(shape) != len(roles):
        return (None,) * len(shape)
    return tuple(r if d == size else None for d, r, size in zip(shape, roles, sizes))


def _splittable(static) -> bool:
    # Unshared dropout keys its bits by the global (batch, head) index.
    return not (static.dropout_rate > 0 and not static.features & DROPOUT_SHARED)


def _feature_roles(shapes, q_shape, k_shape, static):
    """Roles of the NUM_FEATURE_OPERANDS feature operands (shapes in order) against q and k."""
    nl = len(q_shape) - 3
    lead = tuple(part.lead(i) for i in range(nl))
    lead_sizes = tuple(q_shape[:nl])
    t, n = q_shape[nl], q_shape[nl + 1]
    s = k_shape[nl]
    f = static.features
    bias, mask, qlen, kvlen, qseg, kvseg, qrange, kvrange, seed, offsets = shapes
    private = lambda shape: (None,) * len(shape)  # noqa: E731
    table = lead + (part.HEADS_Q, part.SEQ_Q, part.SEQ_K)
    table_sizes = lead_sizes + (n, t, s)
    roles = [
        _matching(bias, table, table_sizes) if f & HAS_BIAS else private(bias),
        _matching(mask, table, table_sizes) if f & HAS_MASK else private(mask),
        _matching(qlen, lead, lead_sizes) if f & HAS_Q_SEQLENS else private(qlen),
        _matching(kvlen, lead, lead_sizes) if f & HAS_KV_SEQLENS else private(kvlen),
    ]
    if f & HAS_SEGMENTS:
        roles += [
            _matching(qseg, lead + (part.SEQ_Q,), lead_sizes + (t,)),
            _matching(kvseg, lead + (part.SEQ_K,), lead_sizes + (s,)),
        ]
    else:
        roles += [private(qseg), private(kvseg)]
    if f & HAS_SEGMENTS and f & HAS_SEGMENT_RANGES:
        roles += [
            _matching(qrange[:-2], lead, lead_sizes) + (None, None),
            _matching(kvrange[:-2], lead, lead_sizes) + (None, None),
        ]
    else:
        roles += [private(qrange), private(kvrange)]
    if static.dropout_rate > 0 and f & DROPOUT_SHARED:
        # One seed per vmapped call: its leading dims are q's outermost ones.
        k = len(seed) - 1
        roles.append(_matching(seed[:-1], lead[:k], lead_sizes[:k]) + (None,))
    else:
        roles.append(private(seed))
    roles.append(_matching(offsets, lead, lead_sizes) if f & HAS_POSITION_OFFSETS else private(offsets))
    return tuple(roles)


def _bias_result_roles(bias_shape):
    nl = len(bias_shape) - 3
    roles = tuple(part.lead(i) for i in range(nl)) + (part.HEADS_Q, part.SEQ_Q, part.SEQ_K)
    return tuple(r if d != 1 else None for r, d in zip(roles, bias_shape))


def _sinks_roles(static, sinks_shape, nl):
    """The sinks operand: [lead dims of q but the last..., N] (broadcast_all's
    batching gives it q's mapped dims), or the placeholder (private)."""
    if not static.features & HAS_SINKS:
        return (None,) * len(sinks_shape)
    return tuple(part.lead(i) for i in range(nl - 1)) + (part.HEADS_Q,)


def _forward_roles(static, shapes):
    q, k, v, *features, sinks = shapes
    nl = len(q) - 3
    qkv = (_q_roles(nl), _k_roles(nl), _k_roles(nl))
    return part.Roles(
        operands=qkv + _feature_roles(features, q, k, static) + (_sinks_roles(static, sinks, nl),),
        results=(_q_roles(nl), _stats_roles(nl)),
        splittable=_splittable(static),
    )


def _backward_operand_roles(static, shapes):
    q, k, v, out, lse, dout, *features = shapes
    nl = len(q) - 3
    return (
        _q_roles(nl), _k_roles(nl), _k_roles(nl), _q_roles(nl), _stats_roles(nl), _q_roles(nl),
    ) + _feature_roles(features, q, k, static)


def _backward_roles(static, shapes):
    nl = len(shapes[0]) - 3
    return part.Roles(
        operands=_backward_operand_roles(static, shapes),
        results=(_q_roles(nl), _k_roles(nl), _k_roles(nl), _stats_roles(nl)),
        splittable=_splittable(static),
    )


def _bias_gradient_roles(static, shapes):
    operands = _backward_operand_roles(static, shapes)
    return part.Roles(
        operands=operands,
        results=(operands[6],),  # dbias: the bias's own dims
        splittable=_splittable(static),
        sum_missing=True,
    )


def _row_stats_shape(q):
    *batch, t, n, _ = q.shape
    return (*batch, n, t)


_FORWARD = part.op(
    "jax_flash_forward",
    impl=lambda static, q, k, v, *f: _ffi_forward(q, k, v, f[:-1], f[-1], static),
    result_avals=lambda static, q, *_: (
        (0, q.shape, q.dtype),
        (0, _row_stats_shape(q), jnp.promote_types(q.dtype, jnp.float32)),
    ),
    roles=_forward_roles,
    result_roles=lambda static, shapes: (
        (_q_roles(len(shapes[0]) - 3), _stats_roles(len(shapes[1]) - 2)), _splittable(static)
    ),
)

_BACKWARD = part.op(
    "jax_flash_backward",
    impl=lambda static, q, k, v, out, lse, dout, *f: _ffi_backward(
        q, k, v, out, lse, dout, f, static
    ),
    result_avals=lambda static, q, k, v, out, lse, *_: (
        (0, q.shape, q.dtype), (1, k.shape, k.dtype), (2, v.shape, v.dtype), (4, lse.shape, lse.dtype),
    ),
    roles=_backward_roles,
    result_roles=lambda static, shapes: (
        (_q_roles(len(shapes[0]) - 3),) + (_k_roles(len(shapes[1]) - 3),) * 2 + (_stats_roles(len(shapes[0]) - 3),),
        _splittable(static),
    ),
)

_BIAS_GRADIENT = part.op(
    "jax_flash_bias_gradient",
    impl=lambda static, q, k, v, out, lse, dout, *f: (
        _ffi_bias_gradient(q, k, v, out, lse, dout, f, static),
    ),
    result_avals=lambda static, *avals: ((6, avals[6].shape, avals[6].dtype),),
    roles=_bias_gradient_roles,
    result_roles=lambda static, shapes: ((_bias_result_roles(shapes[0]),), _splittable(static)),
)
