"""The sm90 kernels' dropout on wgmma fragments (ffi/cuda/sm90/dropout.cuh)
on the host: for random seeds, rates (thresholds 1, 2^16 - 1 and 2^16
among them), several seeds over the batch and the broadcast mask, every
consumer lane's forward fragment keeps exactly the pairs DropoutPolicy
keeps (the definition all families share, reproduced by
reference.dropout_factor), and the backward's keep bits at 64 and 128
queries per step mark exactly those pairs of its S^T fragment. nvcc builds
tests/cpp/sm90_dropout_test.cu as a plain program; skipped without nvcc."""

import shutil

import pytest

from helpers import run_host_check


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_fragment_dropout_matches_the_policy(tmp_path):
    assert " 0 failures" in run_host_check(tmp_path, "sm90_dropout_test.cu")
