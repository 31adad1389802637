"""The GPU backward's key-head copies for GQA (_kernel_call.key_head_copies /
with_key_head_copies): how many copies a shape gets, and that running the
backward on copied key heads and summing their dK / dV gives the gradients
of the uncopied call. The summation is checked here on the CPU kernels
(the GPU takes the same Python path around its own kernel)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import CPU, random_qkv
from jax_flash._kernel_call import (
    HAS_SEGMENT_RANGES,
    HAS_SEGMENTS,
    KernelConfig,
    _backward_call,
    _forward_call,
    key_head_copies,
    with_key_head_copies,
)
from jax_flash.attention import IMPLEMENTATIONS
from jax_flash.ring import _feature_operands


@pytest.mark.parametrize("q_shape, k_shape, sms, want", [
    ((4, 4096, 16, 128), (4, 4096, 2, 128), 132, 4),   # GQA 16:2, T=4096: 256 blocks -> 1024
    ((4, 4096, 16, 128), (4, 4096, 16, 128), 132, 1),  # MHA: nothing to split
    ((1, 131072, 16, 128), (1, 131072, 2, 128), 132, 1),  # 2048 key-head blocks already
    ((1, 1024, 32, 128), (1, 1024, 1, 128), 132, 32),  # MQA, 8 blocks: every query head its own copy
    ((8, 4096, 32, 128), (8, 4096, 1, 128), 132, 4),   # 256 blocks: 2 copies give 512 < 528
    ((2, 3, 1000, 12, 64), (2, 3, 1000, 4, 64), 132, 3),  # vmapped leading dim; G = 3
    ((16, 1024, 16, 128), (16, 1024, 2, 128), 108, 2),  # an A100's 108: 256 blocks, 2 copies reach 432
    ((4, 4096, 16, 256), (4, 4096, 2, 256), 132, 2),   # 64-key blocks beyond 128: 512 -> 1024
    ((4, 4096, 16, 192), (4, 4096, 2, 192), 132, 2),   # (192 runs the 256 kernels)
])
def test_copies_follow_the_block_count(q_shape, k_shape, sms, want):
    assert key_head_copies(q_shape, k_shape, sms) == want


def _config(causal, features=0):
    return KernelConfig(scale=0.3, is_causal=causal, implementation=IMPLEMENTATIONS[None],
                        features=features, window_left=-1, window_right=-1, softcap=0.0,
                        dropout_rate=0.0)


@pytest.mark.parametrize("copies", [2, 4])
@pytest.mark.parametrize("causal, segments", [(False, False), (True, False), (True, True)],
                         ids=["full", "causal", "causal-segments"])
def test_copied_key_heads_give_the_same_gradients(rng, copies, causal, segments):
    b, t, s, n, kh, h = 2, 96, 96, 8, 2, 32  # G = 4
    with jax.default_device(CPU):
        q, k, v = random_qkv(rng, b, t, s, n, kh, h, "float64")
        ids = None
        if segments:
            ids = jnp.asarray(np.repeat([[0, 1, 2]], b, 0).repeat([30, 40, 26], 1), jnp.int32)
        ops = _feature_operands(ids, ids, jnp.float64)
        static = _config(causal, HAS_SEGMENTS | HAS_SEGMENT_RANGES if segments else 0)
        out, lse = _forward_call(q, k, v, ops, static)
        dout = jnp.asarray(rng.standard_normal(q.shape), jnp.float64)
        backward = lambda k, v: _backward_call(q, k, v, out, lse, dout, ops, static)
        want = backward(k, v)
        got = with_key_head_copies(backward, k, v, copies)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        # Only the order of the group's sums differs.
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-12, atol=1e-12, err_msg=name)


def test_one_copy_is_the_call_itself(rng):
    calls = []
    k = jnp.ones((1, 4, 2, 8))
    result = with_key_head_copies(lambda k, v: calls.append(k.shape) or (k, k, v), k, k, 1)
    assert calls == [(1, 4, 2, 8)] and result[1] is k
