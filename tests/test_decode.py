"""Decode-shaped calls: a few new queries (Tq <= 64) over many keys.

On CUDA these run the split-KV decode kernels (ffi/cuda/decode/: the rows of
a tile are the queries x the query heads of one key head; the keys are split
over several blocks whose partials merge by logsumexp); on the CPU the
ordinary kernels. Against the float64 reference, every element of out and
lse, with the features the decode path takes (key lengths, window, soft cap,
GQA). The scratch sizes Python requests agree with the handler's formula.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash import _decode_scratch
from helpers import GRAD_FACTOR, assert_close, random_qkv, reference_f64, reference_grads_f64


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("tq, s", [(1, 4100), (4, 700), (16, 2049), (64, 3000)])
@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (4, 4)])
def test_short_queries_over_long_keys(rng, dtype, tq, s, heads, kv_heads):
    q, k, v = random_qkv(rng, 2, tq, s, heads, kv_heads, 128, dtype)
    out, lse = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, return_residual=True))(q, k, v)
    ref_out, ref_lse = reference_f64(q, k, v)
    assert_close("out", out, ref_out, dtype)
    assert_close("lse", lse, np.swapaxes(ref_lse, -1, -2), dtype)


@pytest.mark.parametrize("head_dim", [64, 96, 256])
def test_head_dims(rng, head_dim):
    q, k, v = random_qkv(rng, 3, 2, 1500, 8, 1, head_dim, "bfloat16")
    out = jax_flash.attention(q, k, v)
    assert_close("out", out, reference_f64(q, k, v)[0], "bfloat16")


@pytest.mark.parametrize("features", ["lengths", "window", "softcap", "all"])
def test_decode_features(rng, features):
    q, k, v = random_qkv(rng, 3, 5, 2500, 8, 2, 128, "bfloat16")
    kw = {}
    if features in ("lengths", "all"):
        kw["key_value_seq_lengths"] = jnp.asarray([1, 1700, 2500], jnp.int32)
    if features in ("window", "all"):
        kw["local_window_size"] = (900, 40)
    if features in ("softcap", "all"):
        q, kw["logits_soft_cap"] = q * 4, 20.0
    out, lse = jax_flash.attention(q, k, v, return_residual=True, **kw)
    ref_out, ref_lse = reference_f64(q, k, v, **kw)
    assert_close("out", out, ref_out, "bfloat16")
    assert_close("lse", lse, np.swapaxes(ref_lse, -1, -2), "bfloat16")


def test_gradients_of_a_decode_shaped_call(rng):
    """The forward may run the decode kernels; the backward (the training
    kernels') takes its out and lse."""
    q, k, v = random_qkv(rng, 2, 8, 1000, 4, 2, 64, "float32")
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    dout = jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16)
    grads = jax.grad(lambda *a: jnp.sum(jax_flash.attention(*a).astype(jnp.float32) * dout), (0, 1, 2))(q, k, v)
    for name, g, w in zip(("dq", "dk", "dv"), grads, reference_grads_f64(q, k, v, dout)):
        assert_close(name, g, w, "bfloat16", GRAD_FACTOR)


def test_scratch_formula_matches_the_kernels_cap():
    """_decode_scratch mirrors ffi/cuda/decode/launch.h: a few spot values
    (B=8, N=32, K=8, Tq=1: 256 blocks a split -> 4 splits by the grid; short
    caches split by their tiles; long rows of queries by the grid)."""
    assert _decode_scratch.max_splits(8, 1, 32, 8, 131072) == 1024 // 64
    assert _decode_scratch.max_splits(1, 1, 32, 8, 64 * 4 * 3) == 3
    assert _decode_scratch.max_splits(1, 1, 32, 8, 100) == 1
    assert _decode_scratch.scratch_floats(1, 1, 32, 8, 100, 128) == 0
    assert _decode_scratch.scratch_floats(8, 1, 32, 8, 131072, 128) == 16 * 8 * 32 * 1 * 129
    # Only decode-shaped 16-bit calls of the automatic dispatch ask for any.
    f = _decode_scratch.forward_scratch_floats
    assert f((8, 1, 32, 128), (8, 131072, 8, 128), jnp.bfloat16, 0) > 0
    assert f((8, 1, 32, 128), (8, 131072, 8, 128), jnp.float32, 0) == 0
    assert f((8, 1, 32, 128), (8, 131072, 8, 128), jnp.bfloat16, 2) == 0  # forced sm80
    assert f((8, 128, 32, 128), (8, 131072, 8, 128), jnp.bfloat16, 0) == 0  # a prefill
