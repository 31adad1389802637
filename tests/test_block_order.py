"""The causal forward's phased block order (ffi/cuda/sm80/block_order.cuh) on
the host: every block of the 1D grid decodes to a distinct (batch, head,
rank), phases launch heaviest-first, a phase keeps each head's blocks
together, and the chunk rule holds at the benchmark's shapes. nvcc builds
tests/cpp/block_order_test.cu as a plain program; skipped without nvcc."""

import shutil

import pytest

from helpers import run_host_check


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_phased_block_order_covers_each_block_once(tmp_path):
    assert " 0 failures" in run_host_check(tmp_path, "block_order_test.cu")
