"""Bad input raises a clear Python exception at trace time, naming the argument."""

import jax
import jax.numpy as jnp
import pytest

import jax_flash
from helpers import ON_GPU, random_qkv


@pytest.fixture
def qkv(rng):
    return random_qkv(rng, 2, 8, 8, 4, 2, 16, "float32")


def test_wrong_rank(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"query must be \[B, T, N, H\] or \[T, N, H\]; got shape \(16, 64\)"):
        jax_flash.attention(q.reshape(16, 64), k, v)
    with pytest.raises(ValueError, match="key must have the query's rank 4"):
        jax_flash.attention(q, k[0], v)


def test_mismatched_head_dims(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="key head dim 8 must equal query head dim 16"):
        jax_flash.attention(q, k[..., :8], v[..., :8])


def test_value_shape_differs_from_key(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"value shape \(2, 7, 2, 16\) must equal key shape"):
        jax_flash.attention(q, k, v[:, :7])


def test_mismatched_batch(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"key batch \(1,\) must equal query batch \(2,\)"):
        jax_flash.attention(q, k[:1], v[:1])


def test_heads_must_divide(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 4, 3, 16, "float32")
    with pytest.raises(ValueError, match="key has 3 heads; it must divide query's 4"):
        jax_flash.attention(q, k, v)


def test_head_dim_too_large(rng):
    q, k, v = random_qkv(rng, 1, 4, 4, 1, 1, 257, "float32")
    with pytest.raises(ValueError, match=r"head dim must be in \[1, 256\]; got 257"):
        jax_flash.attention(q, k, v)


def test_integer_dtype(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match="query dtype must be float16, bfloat16, float32 or float64; got int32"):
        jax_flash.attention(q.astype(jnp.int32), k.astype(jnp.int32), v.astype(jnp.int32))


def test_mixed_dtypes(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match="key dtype must equal query dtype float32; got bfloat16"):
        jax_flash.attention(q, k.astype(jnp.bfloat16), v)


def test_traced_scale(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match="scale must be a static"):
        jax.jit(lambda q, s: jax_flash.attention(q, k, v, scale=s))(q, 0.5)


def test_non_bool_is_causal(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match="is_causal must be a Python bool"):
        jax_flash.attention(q, k, v, is_causal=jnp.array(True))


@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_float64_on_gpu_is_a_clear_error(qkv):
    q, k, v = (x.astype(jnp.float64) for x in qkv)
    with pytest.raises(Exception, match="float64 is not supported by the CUDA kernels"):
        jax.block_until_ready(jax_flash.attention(q, k, v))


def test_unknown_implementation(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="implementation must be one of"):
        jax_flash.attention(q, k, v, implementation="triton")


def test_build_info_reports_platforms():
    info = jax_flash.build_info()
    assert "cpu" in info["platforms"]
    assert info["jax_headers_version"]
    if ON_GPU:
        assert "cuda" in info["platforms"], "running on a GPU with a CPU-only build"
