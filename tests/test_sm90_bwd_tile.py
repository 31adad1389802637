"""The sm90 backward's tile orders (ffi/cuda/sm90/bwd_kernel.cuh's BwdTile) on
the host: every (key block, key head, batch) exactly once, the former order
without sections, a pair's key blocks in increasing tile order (the
deterministic variant's waits go to lower indices only: no deadlock), causal
key blocks outermost within contiguous sections; BackwardCausalSection's
and L2SizedSection's sizes; and the epilogue's dK / dV staging layout
(KeyRowPiece: every pair once, read back in order, no bank conflicts). nvcc builds tests/cpp/sm90_bwd_tile_test.cu as a
plain program; skipped without nvcc."""

import shutil

import pytest

from helpers import run_host_check


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_backward_tile_orders(tmp_path):
    assert " 0 failures" in run_host_check(tmp_path, "sm90_bwd_tile_test.cu")
