"""The example training script runs and learns on a tiny config."""

import importlib.util
import pathlib

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_gpt_flax_loss_falls(tmp_path):
    script = _load("train_gpt_flax")
    history = script.main(
        ["--steps", "40", "--batch-size", "8", "--seq-len", "64", "--width", "64",
         "--depth", "2", "--heads", "2", "--warmup", "5", "--log-every", "10",
         "--out", str(tmp_path)]
    )
    assert history[-1]["loss"] < history[0]["loss"] - 0.3, history
    assert (tmp_path / "metrics.json").exists()
