"""The block classification (MaskPolicy's BlockEmpty / NeedsCheck / Segments,
common/mask_policy.h), which decides which blocks every kernel family visits
and which need per-element checks, against per-element visibility on the host
(tests/cpp/block_class_test.cu, with AddressSanitizer); and the segment-id
summaries that attention() passes the kernels."""

import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from jax_flash.attention import segment_block_ranges
from helpers import run_host_check


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_block_classification_matches_visibility(tmp_path):
    out = run_host_check(tmp_path, "block_class_test.cu")
    assert " 0 mismatched" in out, out


@pytest.mark.parametrize("length", [1, 63, 64, 65, 200])
def test_segment_block_ranges_are_each_blocks_min_and_max(length):
    rng = np.random.default_rng(length)
    ids = rng.integers(-3, 9, (2, 3, length)).astype(np.int32)  # leading dims, as under vmap
    got = np.asarray(segment_block_ranges(jnp.asarray(ids), block=64))
    blocks = -(-length // 64)
    assert got.shape == (2, 3, blocks, 2) and got.dtype == np.int32
    for e in range(blocks):
        chunk = ids[..., e * 64:(e + 1) * 64]
        np.testing.assert_array_equal(got[..., e, 0], chunk.min(-1))
        np.testing.assert_array_equal(got[..., e, 1], chunk.max(-1))
