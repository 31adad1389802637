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


def test_rope_scores_depend_on_relative_position_only():
    _load("train_gpt_flax")  # puts examples/ on sys.path
    import jax
    import jax.numpy as jnp
    import numpy as np
    from common import apply_rope

    q1 = jax.random.normal(jax.random.key(0), (1, 1, 8), jnp.float32)
    k1 = jax.random.normal(jax.random.key(1), (1, 1, 8), jnp.float32)
    seq = lambda x, pos: jnp.zeros((12, 1, 8), jnp.float32).at[pos].set(x[0])
    score = lambda i, j: float(jnp.dot(apply_rope(seq(q1, i))[i, 0], apply_rope(seq(k1, j))[j, 0]))
    np.testing.assert_allclose(score(5, 2), score(9, 6), rtol=1e-5)
    np.testing.assert_allclose(score(0, 0), float(jnp.dot(q1[0, 0], k1[0, 0])), rtol=1e-5)
    assert abs(score(5, 2) - score(5, 3)) > 1e-4


def test_flax_example_on_a_mesh_matches_the_unsharded_run():
    """--mesh data=2,seq=2 (data parallelism, ring attention over the
    sequence; conftest's 4 host devices): the same losses step for step as
    one device."""
    script = _load("train_gpt_flax")
    tiny = ["--batch-size", "4", "--seq-len", "64", "--width", "32", "--depth", "1", "--heads", "2",
            "--steps", "6", "--warmup", "2", "--log-every", "1", "--no-progress", "--sample-chars", "0"]
    sharded = script.main(tiny + ["--mesh", "data=2,seq=2", "--host-devices", "4"])
    single = script.main(tiny)
    for a, b in zip(sharded, single):
        assert abs(a["loss"] - b["loss"]) < 1e-4 * b["loss"], (sharded, single)
        assert abs(a["val_loss"] - b["val_loss"]) < 1e-4 * b["val_loss"], (sharded, single)
    import jax

    with pytest.raises(ValueError, match="needs 8 devices"):
        script.parse_mesh("data=4,seq=2", jax.devices("cpu")[:4])
    assert dict(script.parse_mesh("seq=2", jax.devices("cpu")).shape) == {"data": 1, "seq": 2}
    with pytest.raises(ValueError, match="data=D and/or seq=S"):
        script.parse_mesh("model=2", jax.devices("cpu"))
