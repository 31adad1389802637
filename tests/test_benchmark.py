"""The benchmark entry point runs (tiny sizes on the CPU) and writes its outputs."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash.benchmark as benchmark
from jax_flash import reference
from helpers import load_script


def _compare_bench():
    return load_script("compare_bench")


def test_help_works_without_a_gpu():
    out = subprocess.run([sys.executable, "-m", "jax_flash.benchmark", "--help"], capture_output=True,
                         text=True, check=True, cwd="/")
    assert "--long-seqlen" in out.stdout and "--variant" in out.stdout


def test_tiny_run_writes_json_and_table(tmp_path):
    benchmark.main(["--impl", "jax_flash", "jax_flash_deterministic", "xla", "--head-dim", "32", "--seqlen", "128",
                    "--tokens", "256", "--width", "64", "--causal", "1", "--iters", "2",
                    "--dtype", "float32", "--variant", "plain", "bias", "key_padding_mask", "kv_lengths",
                    "--long-seqlen", "512", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "results.json").read_text())
    rows = result["rows"]
    assert len(rows) == 12 and all("error" not in r for r in rows), rows
    assert all(r["fwd_ms"] > 0 and r["bwd_ms"] > 0 for r in rows)
    assert result["long_sequence"]["grads_finite"]
    table = (tmp_path / "results.md").read_text()
    assert "| jax_flash | bias |" in table and "| xla | kv_lengths |" in table


def test_random_cotangent_times_the_vjp_of_a_given_dout(tmp_path):
    benchmark.main(["--impl", "jax_flash", "--head-dim", "32", "--seqlen", "128", "--tokens", "256",
                    "--width", "64", "--causal", "0", "1", "--iters", "2", "--dtype", "float32",
                    "--cotangent", "random", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["meta"]["cotangent"] == "random"
    assert len(result["rows"]) == 2 and all(r["cotangent"] == "random" and r["bwd_ms"] > 0 for r in result["rows"])


@pytest.mark.parametrize("cotangent", benchmark.COTANGENTS)
def test_forward_backward_fn_gradients_match_the_reference(cotangent):
    # What the benchmark times is the real backward: its gradients against
    # float64 jax.vjp of the reference with the same cotangent (ones for "sum").
    rng = np.random.default_rng(3)
    shape = (2, 64, 2, 32)
    q, k, v, dout = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(4))
    attn = benchmark._attention_fn("jax_flash", causal=True)
    loss, grads = jax.jit(benchmark.forward_backward_fn(attn, cotangent))(q, k, v, None, None, None, dout)
    ref_attn = lambda q, k, v: reference.attention(q, k, v, is_causal=True)
    f64 = lambda x: np.asarray(x, np.float64)
    out, vjp = jax.vjp(ref_attn, f64(q), f64(k), f64(v))
    ref_grads = vjp(np.ones_like(out) if cotangent == "sum" else f64(dout))
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(r), rtol=2e-4, atol=2e-4)
    if cotangent == "sum":
        np.testing.assert_allclose(float(loss), float(np.sum(out)), rtol=1e-4)
    else:
        assert loss is None


def test_unknown_cotangent_is_refused():
    with pytest.raises(ValueError, match="cotangent"):
        benchmark.forward_backward_fn(lambda *a: a[0], "ones")


def test_compare_bench_script(tmp_path, capsys):
    """scripts/compare_bench.py (the A/B table of scripts/gpu_ab.sh) reads two runs' JSON."""
    for name in ("a", "b"):
        benchmark.main(["--impl", "jax_flash", "--head-dim", "32", "--seqlen", "64", "--tokens", "64",
                        "--width", "64", "--causal", "0", "--iters", "1", "--dtype", "float32",
                        "--out", str(tmp_path / name)])
    compare = _compare_bench()
    capsys.readouterr()
    compare.main([f"a={tmp_path / 'a' / 'results.json'}", f"b={tmp_path / 'b' / 'results.json'}"])
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| impl | variant | H | T | causal | a fwd | a bwd | b fwd | b bwd |")
    row = table[2].split("|")
    assert row[1].strip() == "jax_flash" and "x)" in row[8] and "x)" in row[9], table


def test_compare_bench_merges_files_of_one_run(tmp_path, capsys):
    """A run given as comma-separated files (gpu_ab.sh's ';'-separated BENCH_ARGS sets) is their union."""
    common = ["--impl", "jax_flash", "--head-dim", "32", "--seqlen", "64", "--tokens", "64",
              "--width", "64", "--causal", "0", "--iters", "1", "--dtype", "float32"]
    benchmark.main(common + ["--out", str(tmp_path / "plain")])
    benchmark.main(common + ["--variant", "key_padding_mask", "--out", str(tmp_path / "mask")])
    compare = _compare_bench()
    capsys.readouterr()
    both = f"{tmp_path / 'plain' / 'results.json'},{tmp_path / 'mask' / 'results.json'}"
    compare.main([f"two={both}", f"one={tmp_path / 'plain' / 'results.json'}"])
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [r.split("|")[2].strip() for r in rows] == ["key_padding_mask", "plain"], rows
    mask_row = rows[0].split("|")
    assert mask_row[8].strip() == "-", rows  # the one-file run has no mask point


def test_calls_per_sample_amortizes_dispatch_at_short_calls():
    """A sample of short calls repeats them until it lasts min_sample_s (capped); long calls stay single."""
    assert benchmark.calls_per_sample(0.0005, 0.005) == 10
    assert benchmark.calls_per_sample(0.0007, 0.005) == 8  # rounds up: the sample is at least 5 ms
    assert benchmark.calls_per_sample(0.02, 0.005) == 1
    assert benchmark.calls_per_sample(0.0005, 0.0) == 1  # 0: one blocked call per sample
    assert benchmark.calls_per_sample(1e-9, 0.005) == 100  # capped


def test_back_to_back_samples_divide_by_the_call_count(monkeypatch):
    """With a clock that advances 1 ms per call, a 10 ms sample holds 10 calls and reports 1 ms per call."""
    clock = [0.0]
    calls = []

    def fake_fn(x):
        calls.append(x)
        clock[0] += 0.001
        return x

    monkeypatch.setattr(benchmark.time, "perf_counter", lambda: clock[0])
    seconds = benchmark._median_seconds(fake_fn, (1,), iters=3, min_sample_s=0.01)
    assert len(calls) == 2 + 3 * 10, len(calls)  # compile + calibration call, then 3 samples of 10
    assert abs(seconds - 0.001) < 1e-12, seconds
    calls.clear()
    assert abs(benchmark._median_seconds(fake_fn, (1,), iters=3, min_sample_s=0.0) - 0.001) < 1e-12
    assert len(calls) == 2 + 3  # the old method: one blocked call per sample


def test_compare_bench_averages_repeated_rounds(tmp_path, capsys):
    """A point in several files of one run (repeated rounds) is their mean, with the spread after it."""
    def write(path, fwd, bwd):
        path.write_text(json.dumps({"rows": [dict(impl="jax_flash", variant="plain", head_dim=64, seqlen=128,
                                                  causal=False, fwd_tflops=fwd, bwd_tflops=bwd)]}))

    write(tmp_path / "r1.json", 100.0, 50.0)
    write(tmp_path / "r2.json", 110.0, 50.0)
    write(tmp_path / "base.json", 105.0, 25.0)
    compare = _compare_bench()
    capsys.readouterr()
    compare.main([f"base={tmp_path / 'base.json'}", f"two={tmp_path / 'r1.json'},{tmp_path / 'r2.json'}"])
    row = capsys.readouterr().out.splitlines()[2].split("|")
    assert row[6].strip() == "105.0" and row[7].strip() == "25.0", row
    assert row[8].strip() == "105.0 ±5% (1.00x)" and row[9].strip() == "50.0 ±0% (2.00x)", row


def test_sustained_clocks_times_the_real_forward_and_backward():
    """scripts/sustained_clocks.py's loop body is attention's forward and the VJP of
    its dO: checked against float64 jax.vjp of the reference on the same inputs.
    Then the script itself with --seconds 0 (the Nsight Compute target)."""
    probe = load_script("sustained_clocks")
    shape = (1, 64, 2, 32)
    out, grads = probe.jax_wait(probe.jax_step("jax_flash", *shape, causal=True, dtype="float32")())
    forward = probe.jax_wait(probe.jax_step("jax_flash", *shape, causal=True, dtype="float32", forward_only=True)())
    np.testing.assert_array_equal(np.asarray(forward), np.asarray(out))
    rng = np.random.default_rng(0)  # the probe's inputs, in its order
    q, k, v, dout = (rng.standard_normal(shape) for _ in range(4))
    ref_out, vjp = jax.vjp(lambda q, k, v: reference.attention(q, k, v, is_causal=True), q, k, v)
    for got, want in zip((out, *grads), (ref_out, *vjp(dout))):
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want), rtol=2e-4, atol=2e-4)
    probe.main(["--impl", "jax_flash", "--shape", "1,64,2,64", "--seconds", "0"])
    probe.main(["--impl", "jax_flash", "--shape", "1,64,2,64", "--seconds", "0", "--forward-only"])
