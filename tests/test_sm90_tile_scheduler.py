"""The sm90 forward's persistent tile orders (ffi/cuda/sm90/tile_scheduler.cuh)
on the host, order 0 and the L2-aware sectioned one: every tile dealt to
exactly one block, causal tiles heaviest first within each section, a
section's tiles its own heads', causal work balanced across blocks to within
one tile per section; the section sizes (SectionHeads, CausalSection) and
which causal order a call gets (DefaultCausalOrder: at 256 sections only up
to 2 MiB of K/V per key head); the
plain kernel's key blocks per tile and its first masked one per consumer
warpgroup (fwd_kernel.cuh's PlainKeyBlocks, FirstMaskedKeyBlock) for 128-
and 192-row tiles against brute force. nvcc
builds tests/cpp/sm90_tile_scheduler_test.cu as a plain program; skipped
without nvcc."""

import shutil

import pytest

from helpers import run_host_check


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_tile_order_deals_each_tile_once_heaviest_first(tmp_path):
    assert " 0 failures" in run_host_check(tmp_path, "sm90_tile_scheduler_test.cu")
