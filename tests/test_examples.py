"""The example training script runs and learns on a tiny config."""

import importlib.util
import pathlib
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    pytest.importorskip("flax" if "flax" in name else "equinox")
    pytest.importorskip("optax")
    if str(EXAMPLES) not in sys.path:  # the scripts import their sibling common.py
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses (equinox modules) look their module up
    spec.loader.exec_module(module)
    return module


CHECKPOINT = {"train_gpt_flax": "checkpoint.msgpack", "train_gpt_equinox": "model.eqx"}


@pytest.mark.parametrize("name", ["train_gpt_flax", "train_gpt_equinox"])
def test_example_trains_samples_and_resumes(tmp_path, name):
    script = _load(name)
    tiny = ["--batch-size", "8", "--seq-len", "64", "--width", "64", "--depth", "2", "--heads", "2",
            "--out", str(tmp_path), "--no-progress"]
    history = script.main(tiny + ["--steps", "40", "--warmup", "5", "--log-every", "10",
                                  "--sample-chars", "20"])
    # Uniform guessing over the ~100-character vocabulary costs ln(100) = 4.6.
    first, last = history[0]["loss"], history[-1]["loss"]
    assert last < first and last < 3.4, history
    assert (tmp_path / "metrics.json").exists() and (tmp_path / CHECKPOINT[name]).exists()
    assert len((tmp_path / "sample.txt").read_text()) >= 20
    # Restoring the checkpoint gives back the trained model: its loss starts low.
    resumed = script.main(tiny + ["--steps", "1", "--log-every", "1", "--resume", "--sample-chars", "0"])
    assert resumed[0]["loss"] < first - 0.2
