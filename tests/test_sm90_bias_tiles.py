"""The sm90 forward's bias tiles (ffi/cuda/sm90/bias_tiles.cuh, the
kMasksBiasTiles variant) on the host: a tile laid out as TMA's 128-byte
swizzle writes it, read by emulated ldmatrix at the kernel's lane offsets,
gives every consumer lane exactly the bias values of its S fragment (the
floats the backward makes of the same bits), without bank conflicts; the
shared-memory map fits; and BiasTilesServe takes exactly the biases TMA can
read (one row per query, 16-byte strides and base, one flat batch stride).
nvcc builds tests/cpp/sm90_bias_tiles_test.cu as a plain program; skipped
without nvcc. On the GPU, tests/test_bias16.py's aligned cases run the
variant itself."""

import shutil

import pytest

from helpers import run_host_check


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_bias_tiles_match_the_fragments(tmp_path):
    assert " 0 failures" in run_host_check(tmp_path, "sm90_bias_tiles_test.cu")
