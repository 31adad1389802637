"""scripts/two_gpu_check.sh (issue 24's device call) here, with a stand-in
nvidia-smi and the installed package (SKIP_BUILD=1): its sharded and ring
steps run the scripts at tiny sizes on two host devices and write their
result lines, JSON and logs where the device brings them back (at most 8
files), the NCCL environment it exports leaves NVLink multicast off, and a
step the budget cannot fit is skipped with a note; the last lines give the
issue's targets as met or missed."""

import os
import pathlib
import subprocess
import sys
import tarfile

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "two_gpu_check.sh"


def _run(tmp_path, **env):
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "nvidia-smi").write_text(f'#!/bin/sh\nenv > "{tmp_path}/env.txt"\necho "GPU 0: stand-in"\n'
                                     'echo "GPU 1: stand-in"\n')
    (stub / "nvidia-smi").chmod(0o755)
    path = f"{os.path.dirname(sys.executable)}:{stub}:{os.environ['PATH']}"  # python3: this one
    full = {**os.environ, "PATH": path, "OUT": str(tmp_path / "out"), "LOGS": str(tmp_path / "logs"),
            "SKIP_BUILD": "1",
            "JAX_PLATFORMS": "cpu", **env}  # the host devices, also on a one-GPU machine
    done = subprocess.run(["bash", str(SCRIPT)], env=full, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return (tmp_path / "out" / "summary.txt").read_text()


def test_sharded_and_ring_steps(tmp_path):
    summary = _run(
        tmp_path, STEPS="sharded ring",
        SHARDED_ARGS="--batch 2 --seqlen 64 --heads 2 --head-dim 16 --dtype float32 --iters 1",
        RING_ARGS="--devices 2 --seqlen 128 --heads 2 --head-dim 16 --dtype float32 --layouts zigzag "
                  "--overlap --iters 1")
    assert "two_gpu_check: 2 GPUs" in summary
    assert "sharded rc=0" in summary and "batch: no collective" in summary, summary
    assert "heads: sharded over 2 devices" in summary, summary
    assert "ring rc=0" in summary and "scaling zigzag T=128" in summary, summary
    assert summary.count("overlap zigzag") == 2 and "transfer 5: 8.0 KiB" in summary, summary
    assert "target run 1: fwd+bwd " in summary and "at T=128 zigzag (>= 1.70x: " in summary, summary
    assert "target run 2 batch: no collective" in summary and "target run 2 heads" in summary, summary
    assert "target run 3" not in summary and "target run 4: the suite did not finish" in summary, summary
    out = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert out == ["logs.tgz", "ring.json", "sharded.json", "summary.txt"] and len(out) <= 8
    with tarfile.open(tmp_path / "out" / "logs.tgz") as logs:
        assert {"./ring.log", "./sharded.log"} <= set(logs.getnames())
    env = (tmp_path / "env.txt").read_text().splitlines()
    assert {"NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1"} <= set(env)


def test_a_step_past_the_budget_is_skipped(tmp_path):
    summary = _run(tmp_path, STEPS="ring train", BUDGET="30")
    assert "ring: skipped" in summary and "train: skipped" in summary, summary
    assert "ring rc" not in summary
