"""The custom VJP around jax_flash's FFI targets, and the calls themselves."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash import _registration

# Bits of the FFI `features` attribute (ffi/common/ffi_decode.h FeatureBits).
HAS_BIAS, HAS_MASK, HAS_Q_SEQLENS, HAS_KV_SEQLENS, HAS_SEGMENTS = 1, 2, 4, 8, 16
DROPOUT_SHARED = 32
HAS_SEGMENT_RANGES = 64
# Positions per entry of the segment-id block summaries (ffi/common/params.h kSegmentBlock).
SEGMENT_BLOCK = 64


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
# Primal arguments: q, k, v, then the feature operands (bias, mask, q_seqlens,
# kv_seqlens, q_segment_ids, kv_segment_ids, q_segment_ranges,
# kv_segment_ranges, dropout_seed; placeholders when unused), then the
# KernelConfig.
NUM_FEATURE_OPERANDS = 9


@functools.partial(jax.custom_vjp, nondiff_argnums=(3 + NUM_FEATURE_OPERANDS,))
def flash_attention(q, k, v, *rest):
    *feature_ops, static = rest
    return _forward_call(q, k, v, feature_ops, static)


def _flash_attention_fwd(q, k, v, *rest):
    *feature_ops, static = rest
    out, lse = _forward_call(q, k, v, feature_ops, static)
    return (out, lse), (q, k, v, out, lse, tuple(feature_ops))


def _flash_attention_bwd(static, residuals, cotangents):
    q, k, v, out, lse, feature_ops = residuals
    dout, _ = cotangents  # lse leaves attention() under stop_gradient
    dout = dout.astype(q.dtype)
    dq, dk, dv = _backward_call(q, k, v, out, lse, dout, feature_ops, static)
    bias = feature_ops[0]
    if static.features & HAS_BIAS:
        # A separate call, so that XLA drops it when nobody uses the bias gradient.
        dbias = _bias_gradient_call(q, k, v, out, lse, dout, feature_ops, static)
    else:
        dbias = jnp.zeros_like(bias)
    # Integer and bool operands (mask, lengths, segments, seed) get no cotangent.
    return (dq, dk, dv, dbias) + (None,) * (len(feature_ops) - 1)


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


def _row_stats_type(q: jax.Array):
    """lse/delta: [..., N, T], float32 (float64 for float64 inputs)."""
    *batch, t, n, _ = q.shape
    return _result_type(q, (*batch, n, t), jnp.promote_types(q.dtype, jnp.float32))


def _forward_call(q, k, v, feature_ops, static):
    result_types = (_result_type(q, q.shape, q.dtype), _row_stats_type(q))  # out, lse
    call = jax.ffi.ffi_call(_registration.FWD_TARGET, result_types, vmap_method="broadcast_all")
    return call(q, k, v, *feature_ops, **static.attributes())


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


def _backward_call(q, k, v, out, lse, dout, feature_ops, static):
    def call(accum_shape):
        result_types = (
            _result_type(q, q.shape, q.dtype),  # dq
            _result_type(k, k.shape, k.dtype),  # dk
            _result_type(v, v.shape, v.dtype),  # dv
            _row_stats_type(q),  # delta (scratch)
            _result_type(q, accum_shape, jnp.float32),  # dq_accum (scratch)
        )
        ffi = jax.ffi.ffi_call(_registration.BWD_TARGET, result_types, vmap_method="broadcast_all")
        dq, dk, dv, _, _ = ffi(q, k, v, out, lse, dout, *feature_ops, **static.attributes())
        return dq, dk, dv

    if not _uses_dq_accumulator(q, static):
        return call((0,))
    # [..., N, T, H] float32 for the GPU's fused backward; the CPU never needs it.
    *batch, t, n, h = q.shape
    return jax.lax.platform_dependent(
        cpu=lambda: call((0,)), default=lambda: call((*batch, n, t, h))
    )


def _bias_gradient_call(q, k, v, out, lse, dout, feature_ops, static):
    bias = feature_ops[0]
    result_types = (_result_type(bias, bias.shape, bias.dtype), _row_stats_type(q))
    call = jax.ffi.ffi_call(_registration.DBIAS_TARGET, result_types, vmap_method="broadcast_all")
    dbias, _ = call(q, k, v, out, lse, dout, *feature_ops, **static.attributes())
    return dbias
