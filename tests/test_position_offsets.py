"""The kernels' per-batch position offsets (features.position_offsets), called
directly as ring attention calls them, against the float64 reference.

Query row i of batch entry b sits at key position i + offsets[b]: causal sees
keys j <= i + offsets[b], a window (left, right) keys i + offsets[b] - left
<= j <= i + offsets[b] + right. Ring attention's windowed steps rely on it
(each chunk pair one batch entry with its own offset); here the offsets are
drawn freely, negative, zero, past either end, so every mask class of the
block classification (empty, partial, full) and rows that see nothing occur.
On the CPU this runs the C++ kernels, on a GPU the CUDA families (16-bit
inputs: the tensor-core feature variants).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import ON_GPU, assert_close, random_qkv, reference_f64, reference_grads_f64
from jax_flash._kernel_call import HAS_POSITION_OFFSETS, KernelConfig
from jax_flash.attention import IMPLEMENTATIONS
from jax_flash.ring import _bwd, _fwd

DTYPES = ["bfloat16", "float16"] if ON_GPU else ["float64", "float32"]


class _Cfg:
    """The part of ring attention's config that _fwd / _bwd read."""

    def __init__(self, kernel):
        self.kernel = kernel


def _config(h, window, softcap=0.0):
    return _Cfg(KernelConfig(
        scale=float(h) ** -0.5, is_causal=False, implementation=IMPLEMENTATIONS[None],
        features=HAS_POSITION_OFFSETS, window_left=window[0], window_right=window[1],
        softcap=softcap, dropout_rate=0.0))


def _visible(offsets, t, s, causal, window):
    """Bool [B, 1, T, S] of the pairs the offsets leave visible."""
    pos = np.arange(t)[None, :, None] + np.asarray(offsets)[:, None, None]  # [B, T, 1]
    j = np.arange(s)[None, None, :]
    vis = np.ones((len(offsets), t, s), bool)
    if causal:
        vis &= j <= pos
    if window[0] >= 0:
        vis &= j >= pos - window[0]
    if window[1] >= 0:
        vis &= j <= pos + window[1]
    return vis[:, None]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal, window", [
    (True, (-1, -1)),     # causal alone, shifted
    (True, (40, 0)),      # a causal window, as ring attention's windowed steps use it
    (False, (50, 20)),    # a two-sided window
    (False, (1, 0)),      # two keys per row at most
], ids=["causal", "causal-window", "window", "two-keys"])
def test_offsets_match_the_shifted_mask(rng, dtype, causal, window):
    b, t, s, n, kh, h = 5, 150, 200, 4, 2, 64  # GQA, lengths off the block sizes
    offsets = np.array([-70, 0, 37, 180, 260], np.int32)  # 260: some rows past every key; -70: before
    q, k, v = random_qkv(rng, b, t, s, n, kh, h, dtype)
    cfg = _config(h, window)
    off = jnp.asarray(offsets)
    out, lse = jax.jit(lambda q, k, v, o: _fwd(q, k, v, None, None, cfg, causal, offsets=o))(q, k, v, off)
    mask = _visible(offsets, t, s, causal, window)
    want_out, want_lse = reference_f64(q, k, v, mask=mask)
    assert_close("out", out, want_out, dtype)
    # Rows that see no key: lse -inf in both, compared apart.
    seen = np.isfinite(want_lse)
    assert not seen.all() and seen.any(), "the offsets should leave some rows empty, most not"
    assert np.all(np.asarray(lse)[~seen] == -np.inf), "rows with no visible key need lse = -inf"
    assert_close("lse", np.where(seen, np.asarray(lse, np.float64), 0.0), np.where(seen, want_lse, 0.0), dtype)

    dout = jnp.asarray(rng.standard_normal(q.shape), dtype)
    grads = jax.jit(lambda *a: _bwd(*a, None, None, cfg, causal, offsets=off))(q, k, v, out, lse, dout)
    want = reference_grads_f64(q, k, v, dout, mask=mask)
    for name, g, w in zip(("dq", "dk", "dv"), grads, want):
        assert_close(name, g, w, dtype, 2.0)

