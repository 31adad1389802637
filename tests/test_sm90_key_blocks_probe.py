"""The mask summary's block trims on a Hopper GPU (warp votes, so not in the
host check tests/cpp/sm90_feature_mask_test.cu): tests/cuda/
sm90_key_blocks_probe.cu, built with nvcc for sm_90a and run, checks the
forward's FeatureKeyBlocks and the backward's FeatureQueryBlocks against the
blocks the summary says hold a visible pair, and MaskBlocks::SpanOf on the
device against Span on the host (session 27: Span's loop never hid a block
on the H200). Skipped without nvcc or a compute capability 9.x GPU."""

import os
import shutil
import subprocess

import jax
import pytest

from helpers import ON_HOPPER


@pytest.mark.skipif(shutil.which("nvcc") is None or not ON_HOPPER, reason="needs nvcc and a Hopper GPU")
def test_summary_trims_on_the_device(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = tmp_path / "sm90_key_blocks_probe"
    subprocess.run(["nvcc", "-std=c++17", "-O2", "-gencode", "arch=compute_90a,code=sm_90a",
                    "--expt-relaxed-constexpr", "-I", os.path.join(root, "ffi"), "-isystem", jax.ffi.include_dir(),
                    "-o", str(exe), os.path.join(root, "tests", "cuda", "sm90_key_blocks_probe.cu")],
                   check=True, capture_output=True, text=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and "\n0 failures" in run.stdout, run.stdout + run.stderr
