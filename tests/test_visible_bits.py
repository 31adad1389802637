"""The tensor-core kernels' fragment visibility (cuda::VisibleBits) against
MaskPolicy::Visible, on the host: the function is host-device, so nvcc builds
tests/cpp/visible_bits_test.cu as a plain program (with AddressSanitizer, so
out-of-bounds reads of the mask or segment arrays fail as well). Needs nvcc,
which the CUDA build needs anyway; skipped without it."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_visible_bits_matches_mask_policy(tmp_path):
    exe = tmp_path / "visible_bits_test"
    source = os.path.join(ROOT, "tests", "cpp", "visible_bits_test.cu")
    compile_cmd = ["nvcc", "-std=c++17", "-O1", "-g", "--expt-relaxed-constexpr",
                   "-I", os.path.join(ROOT, "ffi"), "-o", str(exe), source]
    asan = ["-Xcompiler", "-fsanitize=address", "-lasan"]
    built = subprocess.run(compile_cmd + asan, capture_output=True, text=True)
    if built.returncode != 0:  # a host compiler without AddressSanitizer: the comparison alone
        subprocess.run(compile_cmd, check=True, capture_output=True, text=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True,
                         env={**os.environ, "ASAN_OPTIONS": "detect_leaks=0"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert " 0 mismatched" in run.stdout, run.stdout
