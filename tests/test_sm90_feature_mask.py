"""The sm90 forward's feature masks (ffi/cuda/sm90/feature_mask.cuh) on the
host: for random lengths, causal, windows, position offsets and segment ids,
a tile's key blocks hold all its visible pairs, blocks the segment summaries
call empty hold none, and every consumer lane's BlockMask marks exactly the
visible pairs of its wgmma fragment (at 128- and 80-key blocks); and the
backward's from the key side (a 128-key tile's query blocks of 64 and of 128,
every lane's FeatureStepMask on its S^T fragment), and the backward's bias
(BiasColumns: every lane's S^T pairs get bias / scale of their own query and
key, broadcasts, tails, no read outside the bias). nvcc builds
tests/cpp/sm90_feature_mask_test.cu as a plain program; skipped without nvcc."""

import shutil

import pytest

from helpers import run_host_check


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_feature_masks_match_the_visibility_definition(tmp_path):
    assert " 0 failures" in run_host_check(tmp_path, "sm90_feature_mask_test.cu")
