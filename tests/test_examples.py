"""The example training script runs and learns on a tiny config."""

import importlib.util
import pathlib
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    if str(EXAMPLES) not in sys.path:  # the scripts import their sibling text_data.py
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses (equinox modules) look their module up
    spec.loader.exec_module(module)
    return module


def test_train_gpt_flax_loss_falls(tmp_path):
    script = _load("train_gpt_flax")
    history = script.main(
        ["--steps", "40", "--batch-size", "8", "--seq-len", "64", "--width", "64",
         "--depth", "2", "--heads", "2", "--warmup", "5", "--log-every", "10",
         "--out", str(tmp_path), "--sample-chars", "20", "--no-progress"]
    )
    # Uniform guessing over the ~100-character vocabulary costs ln(100) = 4.6.
    first, last = history[0]["loss"], history[-1]["loss"]
    assert last < first and last < 3.4, history
    assert (tmp_path / "metrics.json").exists() and (tmp_path / "checkpoint.msgpack").exists()
    assert len((tmp_path / "sample.txt").read_text()) >= 20
    # Restoring the checkpoint gives back the trained model: its loss starts low.
    resumed = script.main(["--steps", "1", "--batch-size", "8", "--seq-len", "64", "--width", "64",
                           "--depth", "2", "--heads", "2", "--log-every", "1", "--out", str(tmp_path),
                           "--resume", "--sample-chars", "0", "--no-progress"])
    assert resumed[0]["loss"] < first - 0.2


def test_train_gpt_equinox_loss_falls(tmp_path):
    pytest.importorskip("equinox")
    script = _load("train_gpt_equinox")
    history = script.main(
        ["--steps", "40", "--batch-size", "8", "--seq-len", "64", "--width", "64",
         "--depth", "2", "--heads", "2", "--warmup", "5", "--log-every", "10",
         "--out", str(tmp_path), "--sample-chars", "20", "--no-progress"]
    )
    first, last = history[0]["loss"], history[-1]["loss"]
    assert last < first and last < 3.4, history
    assert (tmp_path / "model.eqx").exists() and (tmp_path / "sample.txt").exists()
    resumed = script.main(["--steps", "1", "--batch-size", "8", "--seq-len", "64", "--width", "64",
                           "--depth", "2", "--heads", "2", "--log-every", "1", "--out", str(tmp_path),
                           "--resume", "--sample-chars", "0", "--no-progress"])
    assert resumed[0]["loss"] < first - 0.2
