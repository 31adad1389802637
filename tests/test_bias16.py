"""A 16-bit bias stays 16-bit (issue 19): attention() hands a float16/bfloat16
bias of the query's dtype to the kernels as it is, and its gradient comes back
in that dtype, summed in float32 where the bias broadcasts. Against the
float64 reference computed from the same (rounded) bias, every element."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash import _ffi, _kernel_call, _registration, reference
from helpers import GRAD_FACTOR, ON_GPU, ON_HOPPER, assert_close, random_qkv, to_f64_cpu

B, T, S, N, K, H = 2, 37, 45, 4, 2, 32  # odd lengths: partial blocks; GQA 4:2

# The bias shapes the issue names: shared by everything, per batch entry,
# per head, full, and 2-D (padded on the left to [1, 1, T, S]).
BIAS_SHAPES = {
    "1x1xTxS": (1, 1, T, S),
    "Bx1xTxS": (B, 1, T, S),
    "1xNxTxS": (1, N, T, S),
    "BxNxTxS": (B, N, T, S),
    "TxS": (T, S),
}


def _segment_ids(rng, length):
    """Three packed documents per batch row (sorted ids, uneven lengths)."""
    cuts = np.sort(rng.choice(np.arange(1, length), size=2, replace=False))
    ids = np.zeros((B, length), np.int32)
    for b in range(B):
        ids[b, cuts[0]:] = 1
        ids[b, cuts[1]:] = 2
    return jnp.asarray(ids)


def _combo(name, rng):
    """(attention kwargs, reference kwargs) for one mask combination."""
    kw = {}
    if "causal" in name:
        kw["is_causal"] = True
    if "window" in name:
        kw["local_window_size"] = (9, 5)
    if "softcap" in name:  # the cap applies before the bias is added (attention's docstring)
        kw["logits_soft_cap"] = 5.0
    if "segments" in name:
        kw["q_segment_ids"] = _segment_ids(rng, T)
        kw["kv_segment_ids"] = _segment_ids(rng, S)
    return kw, dict(kw)  # reference.attention takes the same mask arguments


COMBOS = ["plain", "causal", "window", "segments", "causal-window-segments", "softcap-causal"]


@pytest.mark.parametrize("combo", COMBOS)
@pytest.mark.parametrize("shape", list(BIAS_SHAPES), ids=list(BIAS_SHAPES))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_bias_out_and_dbias(rng, dtype, shape, combo):
    q, k, v = random_qkv(rng, B, T, S, N, K, H, dtype)
    bias = jnp.asarray(rng.standard_normal(BIAS_SHAPES[shape]), dtype)
    ours, ref_kwargs = _combo(combo, rng)
    dout = jnp.asarray(rng.standard_normal(q.shape), dtype)

    out = jax_flash.attention(q, k, v, bias, **ours)
    ref_out = reference.attention(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), to_f64_cpu(bias),
                                  **ref_kwargs)
    assert out.dtype == q.dtype
    assert_close("out", out, ref_out, dtype)

    def loss(q, k, v, b):
        return jnp.sum(jax_flash.attention(q, k, v, b, **ours).astype(jnp.float32) * dout.astype(jnp.float32))

    grads = jax.grad(loss, (0, 1, 2, 3))(q, k, v, bias)
    ref_grads = jax.grad(
        lambda *a: jnp.sum(reference.attention(*a, **ref_kwargs) * to_f64_cpu(dout)), (0, 1, 2, 3)
    )(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), to_f64_cpu(bias))
    assert grads[3].shape == bias.shape and grads[3].dtype == bias.dtype
    for name, g, r in zip(("dq", "dk", "dv", "dbias"), grads, ref_grads):
        assert_close(name, g, r, dtype, factor=GRAD_FACTOR)


# Shapes whose rows are whole 16 bytes (S a multiple of 8), which the sm90
# forward reads through shared memory (kMasksBiasTiles; BiasTilesServe):
# every broadcast its tensor map takes, and one over the queries, which
# stays kMasksBias16's. 200 x 264: a partial tile of rows and of keys.
T_TILES, S_TILES = 200, 264
TILE_SHAPES = {
    "BxNxTxS": ((B, N, T_TILES, S_TILES), 128),
    "1xNxTxS": ((1, N, T_TILES, S_TILES), 64),
    "Bx1xTxS": ((B, 1, T_TILES, S_TILES), 128),
    "1x1xTxS": ((1, 1, T_TILES, S_TILES), 64),
    "TxS": ((T_TILES, S_TILES), 128),
    "BxNx1xS": ((B, N, 1, S_TILES), 128),  # broadcast over the queries: kMasksBias16
    "1xNxTxS-256": ((1, N, T_TILES, S_TILES), 256),  # (sm80's kernels at 256)
    "BxNx1xS-256": ((B, N, 1, S_TILES), 256),
}


@pytest.mark.parametrize("combo", ["plain", "causal", "causal-window-segments"])
@pytest.mark.parametrize("shape", list(TILE_SHAPES), ids=list(TILE_SHAPES))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_bias_in_whole_16_byte_rows(rng, dtype, shape, combo):
    """The forward's bias tiles (on the GPU; every family computes the same):
    out and the gradients against the reference, head dims 64 and 128 (and
    256: sm80's forward and backward)."""
    bias_shape, head_dim = TILE_SHAPES[shape]
    q, k, v = random_qkv(rng, B, T_TILES, S_TILES, N, K, head_dim, dtype)
    bias = jnp.asarray(rng.standard_normal(bias_shape) * 2.0, dtype)
    ours = {"is_causal": True} if "causal" in combo else {}
    ref_kwargs = dict(ours)
    if "window" in combo:
        ids = (_segment_ids(rng, T_TILES), _segment_ids(rng, S_TILES))
        ours = dict(ours, local_window_size=(70, 0), q_segment_ids=ids[0], kv_segment_ids=ids[1])
        ref_kwargs = dict(ours)
    dout = jnp.asarray(rng.standard_normal(q.shape), dtype)

    def loss(q, k, v, b):
        return jnp.sum(jax_flash.attention(q, k, v, b, **ours).astype(jnp.float32) * dout.astype(jnp.float32))

    out = jax_flash.attention(q, k, v, bias, **ours)
    ref_out = reference.attention(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), to_f64_cpu(bias), **ref_kwargs)
    assert_close("out", out, ref_out, dtype)
    grads = jax.grad(loss, (0, 1, 2, 3))(q, k, v, bias)
    ref_grads = jax.grad(
        lambda *a: jnp.sum(reference.attention(*a, **ref_kwargs) * to_f64_cpu(dout)), (0, 1, 2, 3)
    )(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), to_f64_cpu(bias))
    for name, g, r in zip(("dq", "dk", "dv", "dbias"), grads, ref_grads):
        assert_close(name, g, r, dtype, factor=GRAD_FACTOR)


@pytest.mark.parametrize("shared", [True, False], ids=["bias-shared", "bias-batched"])
def test_16bit_bias_in_whole_16_byte_rows_under_vmap(rng, shared):
    """Two batch dims (vmap over a batched call): a bias shared by the
    vmapped dim (broadcast over every batch dim) or batched with it (its
    batch dims flatten to one stride), as the tiles' map reads them."""
    q, k, v = random_qkv(rng, 3 * B, T_TILES, S_TILES, N, K, 128, "bfloat16")
    q, k, v = (x.reshape(3, B, *x.shape[1:]) for x in (q, k, v))
    bias_shape = (1, N, T_TILES, S_TILES) if shared else (3, B, N, T_TILES, S_TILES)
    bias = jnp.asarray(rng.standard_normal(bias_shape), jnp.bfloat16)
    fn = lambda q, k, v, b: jax_flash.attention(q, k, v, b, is_causal=True)  # noqa: E731
    axes = (0, 0, 0, None if shared else 0)
    out = jax.vmap(fn, in_axes=axes)(q, k, v, bias)
    flat = lambda x: to_f64_cpu(x.reshape(3 * B, *x.shape[2:]))  # noqa: E731
    ref_bias = to_f64_cpu(bias) if shared else flat(bias)
    want = reference.attention(flat(q), flat(k), flat(v), ref_bias, is_causal=True)
    assert_close("out", out.reshape(3 * B, *out.shape[2:]), want, "bfloat16")


@pytest.mark.skipif(not ON_HOPPER, reason="which sm90 variant serves a call (an H100 / H200's kernels)")
def test_bias_tiles_serve_the_calls_they_can_read(rng):
    """The dispatch's choice, seen through the launchers' record (a slower
    variant would compute the same values): a bias in whole 16-byte rows
    goes through the shared-memory tiles, forward at 64 and 128, backward
    and its bias-gradient pass at 128; one broadcast over the queries, or
    with rows TMA cannot read (S odd), stays kMasksBias16's."""
    cases = [  # bias shape, head dim, seqlen_k, forward tiles, backward tiles
        ((1, N, T_TILES, S_TILES), 128, S_TILES, True, True),
        ((B, 1, T_TILES, S_TILES), 64, S_TILES, True, False),  # 64's backward: kMasksBias16
        ((B, N, 1, S_TILES), 128, S_TILES, False, False),
        ((1, N, T_TILES, 45), 128, 45, False, False),
    ]
    _ffi.record_kernels(True)
    try:
        for bias_shape, head_dim, seqlen_k, fwd_tiles, bwd_tiles in cases:
            q, k, v = random_qkv(rng, B, T_TILES, seqlen_k, N, K, head_dim, "bfloat16")
            bias = jnp.asarray(rng.standard_normal(bias_shape), jnp.bfloat16)
            grads = jax.grad(lambda q, k, v, b: jnp.sum(jax_flash.attention(q, k, v, b).astype(jnp.float32)),
                             (0, 1, 2, 3))(q, k, v, bias)
            jax.block_until_ready(grads)
            names = _ffi.recorded_kernels()
            forward = [n for n in names if "forward kernel" in n]
            backward = [n for n in names if "backward kernel" in n or "bias gradient" in n]
            assert forward and len(backward) >= 2, names
            assert all(("16-bit bias tiles" in n) == fwd_tiles for n in forward), (bias_shape, head_dim, forward)
            assert all(("16-bit bias tiles" in n) == bwd_tiles for n in backward), (bias_shape, head_dim, backward)
    finally:
        _ffi.record_kernels(False)


def _custom_call_operand_types(text, target):
    """The operand element types of the first custom call to `target` in a
    StableHLO module's text, as 'bf16', 'f32', ..."""
    for line in text.splitlines():
        if "stablehlo.custom_call" in line and f"@{target}" in line:
            signature = line.rsplit(": (", 1)[1].split(") ->", 1)[0]
            return re.findall(r"tensor<(?:[0-9]+x)*([a-z0-9]+)>", signature)
    raise AssertionError(f"no custom call to {target} in the module")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_bias_reaches_the_kernels_without_a_convert(rng, dtype):
    """The forward, backward and bias-gradient calls take the bias in its own
    dtype (no float32 copy), and dbias leaves the call in it (on the CPU; a
    CUDA build says through build_info whether its kernels do too)."""
    if ON_GPU:
        pytest.skip("inspects the CPU lowering")
    q, k, v = random_qkv(rng, B, T, S, N, K, H, dtype)
    bias = jnp.asarray(rng.standard_normal((1, N, T, S)), dtype)
    bias_type = {"float16": "f16", "bfloat16": "bf16"}[dtype]

    forward = jax.jit(lambda q, b: jax_flash.attention(q, k, v, b)).lower(q, bias)
    assert _custom_call_operand_types(forward.as_text(), _registration.FWD_TARGET)[3] == bias_type
    # No float32 copy of the bias anywhere: it is read once, as given. Checked
    # on the compiled module, where only the CPU's branch of each call is left
    # (older jax lowers every platform's branch into the module's text, the
    # GPU's with its up-cast while cuda_bias_16bit is false).
    float32_bias = f"f32[1,{N},{T},{S}]"
    assert float32_bias not in forward.compile().as_text()

    grad = jax.jit(jax.grad(lambda q, b: jnp.sum(jax_flash.attention(q, k, v, b).astype(jnp.float32)),
                            (0, 1))).lower(q, bias)
    for target in (_registration.BWD_TARGET, _registration.DBIAS_TARGET):
        assert _custom_call_operand_types(grad.as_text(), target)[6] == bias_type, target
    assert float32_bias not in grad.compile().as_text()


@pytest.mark.parametrize("bias_dtype", ["float32", "float16"])
def test_bias_of_another_dtype_is_upcast_and_its_gradient_keeps_its_dtype(rng, bias_dtype):
    """A float32 bias with bfloat16 inputs, or a float16 one (not the query's
    dtype), is taken in float32 as before; dbias comes back in its dtype."""
    q, k, v = random_qkv(rng, B, T, S, N, K, H, "bfloat16")
    bias = jnp.asarray(rng.standard_normal((B, 1, T, S)), bias_dtype)
    dbias = jax.grad(lambda b: jnp.sum(jax_flash.attention(q, k, v, b, is_causal=True).astype(jnp.float32)))(bias)
    assert dbias.dtype == bias.dtype and dbias.shape == bias.shape
    want = jax.grad(lambda b: jnp.sum(reference.attention(
        to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), b, is_causal=True)))(to_f64_cpu(bias))
    assert_close("dbias", dbias, want, "bfloat16", factor=GRAD_FACTOR)


def test_16bit_bias_under_vmap_sums_its_gradient(rng):
    """A bias shared by a vmapped batch (a broadcast leading dim) gets the
    batch's summed gradient, in its dtype."""
    q, k, v = random_qkv(rng, 3, T, S, N, K, H, "bfloat16")
    bias = jnp.asarray(rng.standard_normal((N, T, S)), jnp.bfloat16)
    fn = lambda q, k, v, b: jax_flash.attention(q, k, v, b, is_causal=True)  # noqa: E731
    got = jax.grad(lambda b: jnp.sum(jax.vmap(fn, in_axes=(0, 0, 0, None))(q, k, v, b).astype(jnp.float32)))(bias)
    want = jax.grad(lambda b: jnp.sum(reference.attention(
        to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), b, is_causal=True)))(to_f64_cpu(bias))
    assert got.dtype == jnp.bfloat16
    assert_close("dbias", got, want, "bfloat16", factor=GRAD_FACTOR)


def test_dbias_accumulator_is_sized_for_broadcast_16bit_biases_only():
    """The CUDA bias gradient's float32 scratch: the bias's shape where a
    16-bit gradient is summed by atomics, one element otherwise."""
    q, kk = (B, T, N, H), (B, S, K, H)
    shape = _kernel_call.dbias_accumulator_shape
    assert shape((1, N, T, S), q, kk, jnp.bfloat16, on_gpu=True) == (1, N, T, S)
    assert shape((B, 1, 1, S), q, kk, jnp.float16, on_gpu=True) == (B, 1, 1, S)
    assert shape((B, N, T, S), q, kk, jnp.bfloat16, on_gpu=True) == (1,)  # one writer per element
    assert shape((1, N, T, S), q, kk, jnp.float32, on_gpu=True) == (1,)  # summed in place
    assert shape((1, N, T, S), q, kk, jnp.bfloat16, on_gpu=False) == (1,)  # the CPU sums per task
