"""The tensor-core kernels' fragment visibility (cuda::VisibleBits) against
MaskPolicy::Visible, on the host: the function is host-device, so nvcc builds
tests/cpp/visible_bits_test.cu as a plain program (with AddressSanitizer, so
out-of-bounds reads of the mask or segment arrays fail as well). Needs nvcc,
which the CUDA build needs anyway; skipped without it."""

import shutil

import pytest

from helpers import run_host_check


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_visible_bits_matches_mask_policy(tmp_path):
    assert " 0 mismatched" in run_host_check(tmp_path, "visible_bits_test.cu")
