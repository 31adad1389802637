"""The benchmark entry point runs (tiny sizes on the CPU) and writes its outputs."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
import jax_flash.benchmark as benchmark
from jax_flash import reference
from helpers import to_f64_cpu


def test_help_works_without_a_gpu():
    out = subprocess.run([sys.executable, "-m", "jax_flash.benchmark", "--help"], capture_output=True,
                         text=True, check=True, cwd="/")
    assert "--long-seqlen" in out.stdout and "--variant" in out.stdout and "--preset" in out.stdout


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
    assert "| xla | mask |" in table  # key_padding_mask is the mask variant's earlier name


def test_deterministic_implementations_ask_for_their_backward(monkeypatch):
    # jax_flash_sm80: implementation="sm80"; jax_flash_deterministic(_sm80): deterministic=True,
    # the second also on sm80.
    seen = []
    monkeypatch.setattr(benchmark.jax_flash, "attention", lambda *a, **kw: seen.append(kw))
    x = jnp.zeros((1, 8, 2, 16))
    for impl in ("jax_flash", "jax_flash_sm80", "jax_flash_deterministic", "jax_flash_deterministic_sm80"):
        benchmark._attention_fn(impl, causal=True)(x, x, x)
    assert [(kw["deterministic"], kw["implementation"]) for kw in seen] == [
        (False, None), (False, "sm80"), (True, None), (True, "sm80")]


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


# Tiny points for the variant tests: B=2, T=S=64, N=2, H=32; 4 documents of 16, a window of 8
# keys back, GQA 2:1.
TINY = ["--head-dim", "32", "--seqlen", "64", "--tokens", "128", "--width", "64", "--dtype", "float32",
        "--iters", "1", "--min-sample-ms", "0", "--window", "8", "--gqa-ratio", "2"]
TINY_OPTIONS = benchmark.VariantOptions(window=8, gqa_ratio=2)


def _not_importable(monkeypatch):
    monkeypatch.setattr(benchmark, "_fa3_import", lambda: (None, "ModuleNotFoundError: no dew_flash_attn"))


def test_features_preset_runs_every_variant_and_writes_the_feature_cost_table(tmp_path, monkeypatch):
    """The preset's cases at a tiny point: jax_flash times every variant, xla every one that
    jax.nn.dot_product_attention takes (the others are unsupported rows), FLOPs over visible pairs."""
    _not_importable(monkeypatch)
    benchmark.main(["--preset", "features", "--impl", "jax_flash", "xla", *TINY, "--out", str(tmp_path)])
    result = json.loads((tmp_path / "results.json").read_text())
    rows = result["rows"]
    assert [(r["variant"], r["causal"]) for r in rows[::2]] == list(benchmark.FEATURE_CASES)
    assert result["meta"]["cotangent"] == "random" and all(r["dtype"] == "float32" for r in rows)
    for r in rows:
        if r["impl"] == "xla" and r["variant"] in ("segments", "softcap", "prefix_lm_softcap", "dropout", "sinks"):
            assert r["unsupported"] and r["error"].startswith("unsupported: xla takes no"), r
            continue
        assert "error" not in r and r["fwd_ms"] > 0 and r["bwd_ms"] > 0, r
        pairs = benchmark.visible_pairs(r["variant"], 64, r["causal"], TINY_OPTIONS)
        assert r["visible_fraction"] == pairs / 64**2
        assert r["kv_heads"] == (1 if r["variant"] == "gqa" else 2)
        f = 4 * 2 * 2 * 32 * pairs
        np.testing.assert_allclose(r["fwd_tflops"], f / r["fwd_ms"] / 1e9, rtol=1e-9)
    costs = {(c["impl"], c["variant"]): c for c in result["feature_cost"]}
    assert {v for i, v in costs if i == "jax_flash"} == set(benchmark.VARIANTS) - {"plain"}
    assert {v for i, v in costs if i == "xla"} == {
        "window", "gqa", "kv_lengths", "mask", "prefix_lm", "striped_mask", "bias"}
    for c in costs.values():
        plain = next(r for r in rows if r["impl"] == c["impl"] and r["variant"] == "plain"
                     and r["causal"] == c["causal"])
        variant = next(r for r in rows if r["impl"] == c["impl"] and r["variant"] == c["variant"])
        # (t_variant / t_plain) / (visible_variant / visible_plain)
        cost = (variant["fwd_ms"] / plain["fwd_ms"]) / (variant["visible_fraction"] / plain["visible_fraction"])
        np.testing.assert_allclose(c["fwd_cost"], cost, rtol=1e-9)
        np.testing.assert_allclose(c["fwd_vs_plain"] * c["fwd_cost"], 1.0, rtol=1e-12)
    md = (tmp_path / "results.md").read_text()
    assert "## Temporary memory" not in md and all("fwd_bwd_temp_bytes" not in r for r in rows)  # no --memory
    table = md[md.index("## Feature cost"):].splitlines()
    lines = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in table if line.startswith("| ")}
    assert len(lines) == 1 + len(benchmark.FEATURE_CASES)  # the header and a line per case
    assert lines["plain", "1"].split("|")[8:10] == [" base ", " base "]
    segments = [c.strip() for c in lines["segments", "1"].split("|")]
    assert segments[7] == "0.125" and segments[9] == "n/a" and segments[10:12] == ["-", "-"], segments
    window = [c.strip() for c in lines["window", "1"].split("|")]
    assert window[10].endswith("(xla)") and window[11].endswith("(xla)"), window


def test_preset_options_are_defaults_that_flags_override():
    parser = benchmark._parser()
    args = benchmark._resolve(parser, parser.parse_args(["--preset", "features", "--impl", "jax_flash"]))
    assert (args.dtype, args.head_dim, args.seqlen, args.cotangent) == ("bfloat16", [128], [4096], "random")
    assert (args.tokens // 4096, args.width // 128) == (4, 16)  # B=4, N=16
    assert args.cases == list(benchmark.FEATURE_CASES)
    args = benchmark._resolve(parser, parser.parse_args(["--preset", "features", "--seqlen", "1024",
                                                         "--variant", "key_padding_mask", "bias", "--causal", "0"]))
    assert args.seqlen == [1024] and args.head_dim == [128]
    assert args.cases == [("mask", False), ("bias", False)]
    args = benchmark._resolve(parser, parser.parse_args(["--cases", "segments:1", "key_padding_mask:0"]))
    assert args.cases == [("segments", True), ("mask", False)] and args.head_dim == [64, 128, 256]
    args = benchmark._resolve(parser, parser.parse_args([]))
    assert args.cases == [("plain", False), ("plain", True)] and args.cotangent == "sum"
    with pytest.raises(SystemExit):
        benchmark._resolve(parser, parser.parse_args(["--cases", "plain:1", "--variant", "bias"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--cases", "plain"])


@pytest.mark.parametrize("variant", benchmark.VARIANTS)
def test_visible_pairs_count_what_the_variant_inputs_leave_visible(variant):
    """visible_pairs against a brute-force count of reference.visibility over the variant's own
    arrays, at random small sizes; under a causal mask a diagonal pair counts half."""
    rng = np.random.default_rng(sorted(benchmark.VARIANTS).index(variant))
    for _ in range(6):
        options = benchmark.VariantOptions(documents=int(rng.integers(1, 5)), window=int(rng.integers(0, 40)))
        seqlen = options.documents * int(rng.integers(1, 20))
        causal = bool(rng.integers(2))
        x = benchmark._named(benchmark.variant_inputs(variant, 1, seqlen, 1, jnp.float32, rng, options))
        visible = reference.visibility(
            1, 1, seqlen, seqlen, mask=x["mask"], is_causal=causal, key_value_seq_lengths=x["kv_lengths"],
            local_window_size=(options.window, 0) if variant == "window" else None,
            q_segment_ids=x["segment_ids"], kv_segment_ids=x["segment_ids"])
        weight = np.where(np.eye(seqlen, dtype=bool) & causal, 0.5, 1.0)
        expected = float(np.sum(np.asarray(visible[0, 0]) * weight))
        assert benchmark.visible_pairs(variant, seqlen, causal, options) == expected, (seqlen, causal, options)


def test_sinks_variant_times_attention_with_its_sinks():
    """The sinks rows call jax_flash with the variant's [N] float32 sinks: the output of a direct
    call with them (the sinks' share of every row's softmax is in it), not plain's."""
    rng = np.random.default_rng(5)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 32, 2, 16)), jnp.float32) for _ in range(3))
    extra = benchmark.variant_inputs("sinks", 1, 32, 2, jnp.float32, rng)
    sinks = benchmark._named(extra)["sinks"]
    assert sinks.shape == (2,) and sinks.dtype == jnp.float32
    out = benchmark._attention_fn("jax_flash", True, "sinks")(q, k, v, *extra)
    np.testing.assert_array_equal(out, jax_flash.attention(q, k, v, is_causal=True, sinks=sinks))
    assert not np.allclose(out, jax_flash.attention(q, k, v, is_causal=True), atol=1e-3)


def test_plain_flops_keep_the_earlier_convention():
    """Plain rows stay comparable with every earlier run: 4*B*N*T*T*H, halved when causal (T*T/2 pairs)."""
    for causal in (False, True):
        old = 4.0 * 4 * 16 * 4096 * 4096 * 128 / (2 if causal else 1)
        assert benchmark.flops_forward(4, 4096, 16, 128, causal) == old
    assert benchmark.visible_pairs("segments", 4096, True) == 4096 * 4096 / 2 / 4
    assert benchmark.visible_pairs("kv_lengths", 4096, False) == 4096 * 3584


def test_segments_variant_is_independent_documents():
    """jax_flash on the segments variant's arrays equals the reference with the same segment ids,
    and causal attention over each document by itself."""
    rng = np.random.default_rng(5)
    options = benchmark.VariantOptions(documents=4)
    b, t, n, h = 2, 64, 2, 32
    q, k, v = (jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.float32) for _ in range(3))
    extra = benchmark.variant_inputs("segments", b, t, n, jnp.float32, rng, options)
    out = jax.jit(benchmark._attention_fn("jax_flash", True, "segments", options))(q, k, v, *extra)
    ids = benchmark._named(extra)["segment_ids"]
    # The reference in float64 on the CPU (a GPU's float32 matmuls default to TF32).
    q, k, v = (to_f64_cpu(x) for x in (q, k, v))
    ids = jax.device_put(ids, jax.devices("cpu")[0])
    ref = reference.attention(q, k, v, is_causal=True, q_segment_ids=ids, kv_segment_ids=ids)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-4, atol=1e-5)
    per_document = jnp.concatenate([reference.attention(q[:, s:s + 16], k[:, s:s + 16], v[:, s:s + 16], is_causal=True)
                                    for s in range(0, t, 16)], axis=1)
    np.testing.assert_allclose(np.asarray(out), np.asarray(per_document), rtol=1e-4, atol=1e-5)


def test_fa3_is_an_error_row_when_it_does_not_import(tmp_path, monkeypatch):
    _not_importable(monkeypatch)
    assert benchmark.default_implementations() == list(benchmark.IMPLEMENTATIONS)
    benchmark.main(["--impl", "jax_flash", "fa3", *TINY, "--causal", "1", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert "error" not in rows[0]
    assert rows[1]["impl"] == "fa3" and rows[1]["error"].startswith("fa3 not importable"), rows[1]


class _StandInFa3:
    """dew_flash_attn's two calls, as fa3_for_jax.sh documents them, computed by the reference:
    checks the benchmark's packing of the segments variant into the varlen call."""

    def __init__(self):
        self.max_seqlens = []

    @staticmethod
    def flash_mha(q, k, v, is_causal=False, window_size=(-1, -1)):
        window = None if window_size == (-1, -1) else window_size
        return reference.attention(q, k, v, is_causal=is_causal, local_window_size=window)

    def flash_mha_varlen(self, q, k, v, cu_seqlens, max_seqlen, is_causal=False):
        assert q.ndim == 3 and cu_seqlens.dtype == jnp.int32
        self.max_seqlens.append(max_seqlen)
        ids = (jnp.searchsorted(cu_seqlens, jnp.arange(q.shape[0]), side="right") - 1)[None].astype(jnp.int32)
        return reference.attention(q[None], k[None], v[None], is_causal=is_causal, q_segment_ids=ids,
                                   kv_segment_ids=ids)[0]


def test_fa3_calls_match_jax_flash_with_a_stand_in_module(tmp_path, monkeypatch):
    fa3 = _StandInFa3()
    monkeypatch.setattr(benchmark, "_fa3_import", lambda: (fa3, None))
    # dew_flash_attn imports without a GPU: the default list takes fa3 only where a GPU runs it.
    with monkeypatch.context() as cpu:
        cpu.setattr(benchmark.jax, "default_backend", lambda: "cpu")
        assert benchmark.default_implementations() == list(benchmark.IMPLEMENTATIONS)
    with monkeypatch.context() as gpu:
        gpu.setattr(benchmark.jax, "default_backend", lambda: "gpu")
        assert benchmark.default_implementations() == [*benchmark.IMPLEMENTATIONS, "fa3"]
    rng = np.random.default_rng(6)
    b, t, n, h = 2, 64, 2, 32
    # The harness's packing is under test, not a kernel: on the CPU, where the
    # stand-in's float32 matmuls are exact (a GPU would run them as TF32).
    cpu = jax.devices("cpu")[0]
    for variant in benchmark.SUPPORTED["fa3"]:
        kv = benchmark.kv_heads(variant, n, TINY_OPTIONS)
        with jax.default_device(cpu):
            q = jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.float32)
            k, v = (jnp.asarray(rng.standard_normal((b, t, kv, h)), jnp.float32) for _ in range(2))
            extra = benchmark.variant_inputs(variant, b, t, n, jnp.float32, rng, TINY_OPTIONS)
            got, want = (jax.jit(benchmark._attention_fn(impl, True, variant, TINY_OPTIONS))(q, k, v, *extra)
                         for impl in ("fa3", "jax_flash"))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5, err_msg=variant)
    assert fa3.max_seqlens == [t // 4]
    benchmark.main(["--impl", "jax_flash", "fa3", *TINY, "--cases", "plain:1", "segments:1", "bias:0",
                    "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    fa3_rows = [r for r in rows if r["impl"] == "fa3"]
    assert ["error" in r for r in fa3_rows] == [False, False, True] and fa3_rows[2]["unsupported"]
    table = (tmp_path / "results.md").read_text()
    assert "(fa3) |" in table  # the best peer in the feature-cost table


DECODE_TINY = ["--preset", "decode", "--head-dim", "32", "--batch", "2", "--heads", "4", "--kv-heads", "2",
               "--decode-points", "1:64", "5:96", "--block-size", "16", "--dtype", "float32", "--iters", "1",
               "--min-sample-ms", "0"]


def test_decode_preset_writes_the_latency_table_with_the_floor(tmp_path, monkeypatch):
    _not_importable(monkeypatch)
    impls = ["jax_flash", "jax_flash_paged", "xla", "cudnn", "fa3"]
    benchmark.main(DECODE_TINY + ["--impl", *impls, "--out", str(tmp_path)])
    result = json.loads((tmp_path / "results.json").read_text())
    rows = result["rows"]
    assert [(r["impl"], r["tq"], r["seqlen"]) for r in rows] == [(i, *p) for p in ((1, 64), (5, 96)) for i in impls]
    for r in rows:
        floor = 2 * 2 * r["seqlen"] * 2 * 32 * 4 / 4.3e12 * 1e6  # 2*B*S*K*H*itemsize bytes at 4.3 TB/s
        np.testing.assert_allclose(r["floor_us"], floor, rtol=1e-12)
        if r["impl"] == "fa3":
            assert r["unsupported"] and r["error"].startswith("fa3 not importable"), r
        elif r["impl"] == "cudnn" and (jax.default_backend() == "cpu" or "error" in r):
            # No cuDNN on the CPU; on a GPU it may refuse float32 (a failed row, not "unsupported").
            assert "error" in r and not r.get("unsupported"), r
        else:
            assert r["fwd_us"] > 0 and r["vs_floor"] == r["fwd_us"] / r["floor_us"], r
            # The run checks itself: every implementation against jax_flash at the same point
            # (on a GPU, XLA's and cuDNN's float32 products run as TF32: 10-bit mantissas).
            tf32 = r["impl"] in ("xla", "cudnn") and jax.default_backend() == "gpu"
            assert r["max_diff_vs_jax_flash"] < (3e-3 if tf32 else 1e-5), r
    assert all(r["block_size"] == 16 for r in rows if r["impl"] == "jax_flash_paged")
    table = (tmp_path / "results.md").read_text().splitlines()
    header = next(line for line in table if line.startswith("| B |"))
    assert [c.strip() for c in header.split("|")[1:-1]] == (
        ["B", "Tq", "S", "N", "K", "H"] + [f"{i} us" for i in impls] + ["floor us"])
    lines = [line.split("|")[1:-1] for line in table if line.startswith("| 2 |")]
    assert [(c[1].strip(), c[2].strip()) for c in lines] == [("1", "64"), ("5", "96")]
    for cells in lines:
        assert cells[6].strip().endswith("x)") and cells[10].strip() == "n/a", cells
        assert float(cells[11]) == pytest.approx(2 * 2 * int(cells[2]) * 2 * 32 * 4 / 4.3e12 * 1e6, abs=0.05)


def test_decode_ragged_point_reads_the_lengths_and_floors_on_their_keys(tmp_path, monkeypatch):
    """--ragged-points: lengths spread over 1..S, every implementation masked by them (checked
    against jax_flash, which the test below checks against the reference), the floor over the
    keys the lengths cover, FA3 n/a, the S cell marked ragged."""
    from jax_flash import benchmark_decode as decode

    _not_importable(monkeypatch)
    impls = ["jax_flash", "jax_flash_paged", "xla", "fa3"]
    args = [a for a in DECODE_TINY if a not in ("1:64", "5:96")]
    args[args.index("--decode-points") + 1:args.index("--decode-points") + 1] = ["1:64"]
    benchmark.main(args + ["--ragged-points", "1:96", "--impl", *impls, "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    ragged = [r for r in rows if r["variant"] == "decode_ragged"]
    assert [r["impl"] for r in ragged] == impls
    lengths = decode.ragged_lengths(2, 96)
    assert lengths.tolist() == [48, 96] and all(r["lengths"] == [48, 96] for r in ragged)
    for r in ragged:
        np.testing.assert_allclose(r["floor_us"], 2 * (48 + 96) * 2 * 32 * 4 / 4.3e12 * 1e6, rtol=1e-12)
        if r["impl"] == "fa3":
            assert r["unsupported"], r
        else:
            tf32 = r["impl"] == "xla" and jax.default_backend() == "gpu"
            assert r["max_diff_vs_jax_flash"] < (3e-3 if tf32 else 1e-5), r
    # The lengths matter: the first sequence's output differs from attention over all 96 keys.
    arrays = decode.decode_inputs(2, 1, 96, 4, 2, 32, jnp.float32, 16, seed=1, ragged=True)
    masked = jax_flash.attention(arrays["q"], arrays["k"], arrays["v"], key_value_seq_lengths=arrays["kv_lengths"])
    full = jax_flash.attention(arrays["q"], arrays["k"], arrays["v"])
    assert not np.allclose(masked[0], full[0]) and np.allclose(masked[1], full[1], rtol=1e-6, atol=1e-6)
    table = (tmp_path / "results.md").read_text()
    assert "| 2 | 1 | 1..96 (ragged) |" in table


def test_decode_paged_rows_per_block_size_hold_the_same_attention(tmp_path, monkeypatch):
    """--block-size takes several sizes (issue 22: paged at 16 to 256): a paged row and a table
    column per size at every point, ragged included, each over its own pool of the same keys
    and equal to the contiguous call."""
    _not_importable(monkeypatch)
    args = DECODE_TINY.copy()
    args[args.index("--block-size") + 1] = "8"
    args.insert(args.index("--block-size") + 2, "32")
    benchmark.main(args + ["--ragged-points", "1:96", "--impl", "jax_flash", "jax_flash_paged",
                           "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    paged = [r for r in rows if r["impl"] == "jax_flash_paged"]
    assert [(r["seqlen"], r["variant"], r["block_size"]) for r in paged] == [
        (64, "decode", 8), (64, "decode", 32), (96, "decode", 8), (96, "decode", 32),
        (96, "decode_ragged", 8), (96, "decode_ragged", 32)]
    assert all(r["max_diff_vs_jax_flash"] < 1e-5 for r in paged), paged
    header = next(line for line in (tmp_path / "results.md").read_text().splitlines() if line.startswith("| B |"))
    assert "| jax_flash_paged/8 us | jax_flash_paged/32 us |" in header
    # The pools differ (block tables of their own sizes) over the same keys.
    from jax_flash import benchmark_decode as decode
    arrays = decode.decode_inputs(2, 1, 64, 4, 2, 32, jnp.float32, 8, seed=0)
    other = decode.repaged(arrays, 32, seed=0)
    assert arrays["block_tables"].shape == (2, 8) and other["block_tables"].shape == (2, 2)
    assert other["key_cache"].shape == (4, 32, 2, 32)
    blocks = np.asarray(other["key_cache"])[np.asarray(other["block_tables"])]  # [B, blocks, bs, K, H]
    np.testing.assert_array_equal(blocks.reshape(2, 64, 2, 32), np.asarray(arrays["k"]))


def test_decode_ragged_points_refuse_more_than_one_new_token(tmp_path):
    with pytest.raises(SystemExit):
        benchmark.main(DECODE_TINY + ["--ragged-points", "4:96", "--out", str(tmp_path)])


@pytest.mark.parametrize("tq, seqlen", [(1, 40), (6, 48)])
def test_decode_implementations_compute_bottom_right_causal_attention(tq, seqlen):
    """Every CPU implementation of the decode table against float64 reference attention in which
    query t sees keys j <= S - Tq + t, on the same arrays (the pool holds k and v in shuffled blocks)."""
    from jax_flash import benchmark_decode as decode

    arrays = decode.decode_inputs(2, tq, seqlen, 4, 2, 16, jnp.float32, 8, seed=7)
    f64 = {n: to_f64_cpu(arrays[n]) for n in ("q", "k", "v")}
    visible = np.arange(seqlen)[None, :] <= seqlen - tq + np.arange(tq)[:, None]
    ref = jax.jit(lambda q, k, v, mask: reference.attention(q, k, v, mask=mask))  # one compilation, not one per op
    want = ref(f64["q"], f64["k"], f64["v"], visible[None, None])
    if tq > 1:  # the mask matters at this point: full attention differs
        full = ref(f64["q"], f64["k"], f64["v"], np.ones_like(visible)[None, None])
        assert np.max(np.abs(np.asarray(full) - np.asarray(want))) > 1e-2
    for impl in ("jax_flash", "jax_flash_paged"):  # xla is checked against jax_flash in the run above
        fn, names = decode.decode_fn(impl)
        got = jax.jit(fn)(*(arrays[n] for n in names))
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want), rtol=1e-5, atol=1e-5,
                                   err_msg=impl)


def test_decode_preset_defaults_are_the_issues_table():
    parser = benchmark._parser()
    args = benchmark._resolve(parser, parser.parse_args(["--preset", "decode"]))
    assert (args.dtype, args.head_dim, args.batch, args.heads, args.kv_heads, args.block_size) == (
        "bfloat16", [128], 8, 32, 8, [16, 64, 256])
    assert list(args.decode_points) == [(1, 8192), (1, 32768), (1, 131072), (16, 32768)]
    assert args.impl[:4] == ["jax_flash", "jax_flash_paged", "cudnn", "xla"]
    args = benchmark._resolve(parser, parser.parse_args(["--preset", "decode", "--decode-points", "4:1024",
                                                         "--batch", "2"]))
    assert args.decode_points == [(4, 1024)] and args.batch == 2 and args.heads == 32
    with pytest.raises(SystemExit):  # paged attention has no training-shape rows
        benchmark._resolve(parser, parser.parse_args(["--impl", "jax_flash_paged"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--preset", "decode", "--decode-points", "8:4"])


def test_rows_record_the_temporary_memory_of_fwd_bwd(tmp_path):
    # XLA's attention materializes the [B, N, T, S] probabilities, jax_flash
    # holds O(B*N*T*H) beside its arguments: the measurement must show both.
    b, t, n, h = 2, 256, 2, 32
    benchmark.main(["--impl", "jax_flash", "xla", "--head-dim", str(h), "--seqlen", str(t),
                    "--tokens", str(b * t), "--width", str(n * h), "--causal", "0", "--iters", "1",
                    "--dtype", "float32", "--cotangent", "random", "--memory", "--out", str(tmp_path)])
    rows = {r["impl"]: r for r in json.loads((tmp_path / "results.json").read_text())["rows"]}
    probs = b * n * t * t * 4
    assert rows["xla"]["fwd_bwd_temp_bytes"] >= probs
    assert 0 < rows["jax_flash"]["fwd_bwd_temp_bytes"] < probs // 4
    table = (tmp_path / "results.md").read_text().split("## Temporary memory, fwd+bwd")[1]
    want = f"| plain | 0 | {b} | {t} | {n} | {h} | {rows['jax_flash']['fwd_bwd_temp_bytes'] / 2**20:.1f} |"
    assert want in table, table
    ratio = rows["jax_flash"]["fwd_bwd_temp_bytes"] / rows["xla"]["fwd_bwd_temp_bytes"]
    assert table.rstrip().endswith(f"| {ratio:.2f} (xla) |"), table
