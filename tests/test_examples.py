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


@pytest.mark.parametrize("extra", [[], ["--sinks"]], ids=["plain", "sinks"])
def test_flax_example_on_a_mesh_matches_the_unsharded_run(extra):
    """--mesh data=2,seq=2 (data parallelism, ring attention over the
    sequence; conftest's 4 host devices): the same losses step for step as
    one device; with --sinks too (learned sinks, replicated into the ring,
    their gradient summed over it)."""
    script = _load("train_gpt_flax")
    tiny = ["--batch-size", "4", "--seq-len", "64", "--width", "32", "--depth", "1", "--heads", "2",
            "--steps", "6", "--warmup", "2", "--log-every", "1", "--no-progress", "--sample-chars", "0", *extra]
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


def test_flax_example_on_a_mesh_compiles_its_step_once(monkeypatch):
    """After step 1 nothing compiles again on a mesh (the optimizer state
    starts replicated, as step 1 returns it), so tokens/s, counted from step
    1's log on, is the steps' own speed (issue 24 compares it with one device)."""
    import logging

    import jax

    script = _load("train_gpt_flax")
    compiles, marks = [], []

    class Count(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Compiling "):
                compiles.append(record.getMessage())

    log_step = script.log_step
    monkeypatch.setattr(script, "log_step", lambda *a: (marks.append(len(compiles)), log_step(*a)))
    handler = Count()
    logging.getLogger("jax").addHandler(handler)
    try:
        with jax.log_compiles(True):
            script.main(["--batch-size", "4", "--seq-len", "32", "--width", "32", "--depth", "1",
                         "--heads", "2", "--steps", "3", "--warmup", "1", "--log-every", "1",
                         "--no-progress", "--sample-chars", "0", "--mesh", "data=2,seq=2",
                         "--host-devices", "4"])
    finally:
        logging.getLogger("jax").removeHandler(handler)
    assert len(marks) == 3 and marks[0] > 0, marks
    assert compiles[marks[0]:] == [], compiles[marks[0]:]


def _rerun_greedy(model, prompt, new_tokens, width):
    """The oracle: greedy decoding by re-running the whole prefix for every
    token (a fixed [1, width] window, right-padded: causal attention makes
    the padding irrelevant, and one compilation serves every length)."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    logits_fn = nnx.jit(lambda model, x: model(x))
    tokens = list(prompt)
    for _ in range(new_tokens):
        x = np.zeros((1, width), np.int32)
        x[0, : len(tokens)] = tokens
        tokens.append(int(np.argmax(np.asarray(logits_fn(model, jnp.asarray(x)))[0, len(tokens) - 1])))
    return tokens[len(prompt):]


@pytest.mark.parametrize("positions,sinks", [("rope", False), ("learned", False), ("rope", True)],
                         ids=["rope", "learned", "rope-sinks"])
def test_cached_greedy_decoding_matches_rerunning_the_prefix(positions, sinks):
    """GPT.extend over a paged pool (prefill, then paged_attention a token at
    a time) gives the tokens that re-running the prefix gives, float32, for
    a batch of prompts of different lengths crossing several 4-position blocks;
    with attention sinks (set away from their initial 0) in every path too."""
    script = _load("train_gpt_flax")
    import jax.numpy as jnp
    from flax import nnx
    from paged_decode import generate

    vocab, seq_len = 40, 32
    model = script.GPT(vocab, seq_len, 32, 2, 2, "flash", positions, jnp.float32, nnx.Rngs(1), sinks=sinks)
    if sinks:
        for i, block in enumerate(model.blocks):
            block.attn.sinks = nnx.Param(jnp.asarray([1.5, -0.5]) + i)
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6, 5, 3], [5]]
    cached, stats = generate(model, prompts, 10, block_size=4)
    assert stats.prefill_calls == 1 and stats.decode_steps == 9
    assert cached == [_rerun_greedy(model, p, 10, seq_len) for p in prompts]
    assert len({tuple(c) for c in cached}) == 3  # not one degenerate output


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A train_gpt_flax.py --out directory after a few steps of a tiny model."""
    out = tmp_path_factory.mktemp("tiny_run")
    _load("train_gpt_flax").main(["--batch-size", "4", "--seq-len", "64", "--width", "32", "--depth", "1",
                                  "--heads", "2", "--steps", "5", "--warmup", "1", "--log-every", "5",
                                  "--sample-chars", "0", "--no-progress", "--out", str(out)])
    return out


def test_serve_paged_batched_equals_one_at_a_time(tiny_checkpoint, capsys):
    """examples/serve_paged.py on a trained checkpoint: greedy generation of
    five prompts decoded together, two at a time (the free list hands the
    blocks of finished sequences to waiting prompts) and one at a time
    gives the same tokens; the texts and the rate are printed."""
    serve = _load("serve_paged")
    common = ["--checkpoint", str(tiny_checkpoint), "--max-new-tokens", "12", "--temperature", "0",
              "--block-size", "4", "--stop", ""]
    batched, stats = serve.main(common)
    printed = capsys.readouterr().out
    assert len(batched) == len(serve.DEFAULT_PROMPTS) and all(len(g) == 12 for g in batched)
    assert stats.prefill_calls == 1 and stats.decode_steps == 11 and stats.tokens_per_s > 0
    for prompt in serve.DEFAULT_PROMPTS:
        assert f"--- {prompt!r} (12 tokens)" in printed
    assert "decode" in printed and "tokens/s" in printed
    # Two slots over a pool that holds only them: the later prompts need the freed blocks.
    longest = max(len(p) for p in serve.DEFAULT_PROMPTS) + 12
    two_slots = 2 * -(-longest // 4)
    pairs, pair_stats = serve.main(common + ["--max-batch", "2", "--num-blocks", str(two_slots)])
    assert pairs == batched and pair_stats.prefill_calls == 3
    assert serve.main(common + ["--max-batch", "1"])[0] == batched
    with pytest.raises(RuntimeError, match="out of blocks"):
        serve.main(common + ["--num-blocks", "3"])


def test_serve_paged_stops_at_the_stop_character(tiny_checkpoint):
    serve = _load("serve_paged")
    outputs, _ = serve.main(["--checkpoint", str(tiny_checkpoint), "--max-new-tokens", "30",
                             "--temperature", "1.5", "--stop", " "])
    corpus = sys.modules["common"].CharCorpus()
    space = corpus.encode(" ")[0]
    for generated in outputs:
        assert space not in generated[:-1] and (len(generated) == 30 or generated[-1] == space)
    assert any(len(g) < 30 for g in outputs)  # at temperature 1.5 an untrained-ish model emits spaces
