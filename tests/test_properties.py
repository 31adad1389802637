"""Property tests: random shapes, dtypes and feature combinations against the
float64 reference, forward (output and logsumexp) and gradients (q, k, v and
the bias) through jax.grad.

No hypothesis: each seed of SEEDS draws CASES_PER_SEED cases with NumPy; a
failure names its seed and prints the drawn case as a dict that can be pasted
into REGRESSIONS, which always run. Sizes are bounded (T, S <= 80, H <= 96)
so the file runs in well under a minute on two cores.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash import reference
from helpers import GRAD_FACTOR, ON_GPU, TOLERANCE, assert_close, to_f64_cpu

SEEDS = list(range(8))
CASES_PER_SEED = 5  # 40 drawn cases
DTYPES = ["float32", "float64", "bfloat16", "float16"]
HEAD_DIMS = [1, 2, 3, 5, 7, 8, 15, 16, 31, 32, 33, 48, 63, 64, 65, 80, 95, 96]
BIAS_SHAPES = ["BNTS", "1NTS", "B11S", "TS", "NTS", "BN1S", "11T1"]
MASK_SHAPES = ["B11S", "BNTS", "TS", "B1T1"]
ROUNDING_ULPS = 4  # see assert_grad_close

# Explicit cases, always run: edges and any drawn case that once failed.
REGRESSIONS = [
    dict(B=1, T=1, S=1, N=1, K=1, H=1, dtype="float32"),
    dict(B=1, T=1, S=1, N=1, K=1, H=1, dtype="float64", causal=True, bias="BNTS"),
    dict(B=2, T=1, S=67, N=2, K=1, H=8, dtype="bfloat16", causal=True),  # row 0 sees key 0 only
    dict(B=2, T=33, S=1, N=3, K=3, H=16, dtype="float16", mask="B11S", bias="B11S"),
    dict(B=1, T=17, S=17, N=1, K=1, H=1, dtype="float32", window=(0, 0), softcap=2.0),
    dict(B=2, T=20, S=30, N=2, K=1, H=5, dtype="float64", q_lengths=[0, 20], kv_lengths=[30, 0]),
    dict(B=2, T=9, S=1, N=1, K=1, H=3, dtype="float32", segments="unsorted"),
    dict(B=1, T=40, S=40, N=4, K=2, H=96, dtype="float32", causal=True, dropout=(0.5, True),
         segments="sorted", bias="1NTS", softcap=5.0),
]


def draw_case(rng) -> dict:
    """One random case: sizes, dtype and features (a plain, printable dict)."""
    k = int(rng.choice([1, 1, 2, 3]))
    case = dict(
        B=int(rng.integers(1, 3)), T=int(rng.integers(1, 81)), S=int(rng.integers(1, 81)),
        K=k, N=k * int(rng.choice([1, 2, 3])),
        H=int(rng.choice(HEAD_DIMS) if rng.random() < 0.6 else rng.integers(1, 97)),
        dtype=str(rng.choice(DTYPES)))
    b, t, s = case["B"], case["T"], case["S"]
    if rng.random() < 0.35:
        case["causal"] = True
    if rng.random() < 0.25:
        case["window"] = (int(rng.integers(0, 25)), int(rng.integers(0, 25)))
    if rng.random() < 0.25:
        case["q_lengths"] = [int(x) for x in rng.integers(0, t + 1, b)]
    if rng.random() < 0.25:
        case["kv_lengths"] = [int(x) for x in rng.integers(0, s + 1, b)]
    if rng.random() < 0.3:
        case["segments"] = str(rng.choice(["sorted", "unsorted"]))
    if rng.random() < 0.3:
        case["mask"] = str(rng.choice(MASK_SHAPES))
    if rng.random() < 0.35:
        case["bias"] = str(rng.choice(BIAS_SHAPES))
    if rng.random() < 0.25:
        case["softcap"] = float(np.round(rng.uniform(0.5, 10.0), 2))
    if rng.random() < 0.2:
        case["dropout"] = (float(rng.choice([0.1, 0.3, 0.5])), bool(rng.random() < 0.3))
    if rng.random() < 0.15:
        case["scale"] = float(np.round(rng.uniform(0.05, 1.0), 3))
    return case


def _shape(letters, sizes):
    return tuple(1 if c == "1" else sizes[c] for c in letters)


def build(case, seed):
    """(q, k, v, bias, dout, our kwargs, reference kwargs) for a case, as
    NumPy arrays (ml_dtypes for the 16-bit floats: no XLA conversion to compile)."""
    rng = np.random.default_rng(seed)
    b, t, s, n, kh, h = (case[c] for c in "BTSNKH")
    dtype = jnp.dtype(case["dtype"])
    acc = jnp.promote_types(dtype, jnp.float32)
    sizes = dict(B=b, T=t, S=s, N=n)
    normal = lambda *shape: rng.standard_normal(shape)
    q, k, v = (normal(*shape).astype(dtype)
               for shape in ((b, t, n, h), (b, s, kh, h), (b, s, kh, h)))
    dout = normal(b, t, n, h).astype(dtype)
    ours, ref = {}, {}
    bias = None
    if "bias" in case:
        bias = normal(*_shape(case["bias"], sizes)).astype(acc)
    if "mask" in case:
        keep = 0.7 if case["mask"] == "B11S" else 0.5
        ours["mask"] = ref["mask"] = rng.random(_shape(case["mask"], sizes)) < keep
    if case.get("causal"):
        ours["is_causal"] = ref["is_causal"] = True
    if "window" in case:
        ours["local_window_size"] = ref["local_window_size"] = tuple(case["window"])
    if "q_lengths" in case:
        ours["query_seq_lengths"] = ref["query_seq_lengths"] = np.array(case["q_lengths"], np.int32)
    if "kv_lengths" in case:
        ours["key_value_seq_lengths"] = ref["key_value_seq_lengths"] = np.array(
            case["kv_lengths"], np.int32)
    if "segments" in case:
        ids = lambda length: rng.integers(0, 3, (b, length))
        q_ids, kv_ids = ids(t), ids(s)
        if case["segments"] == "sorted":
            q_ids, kv_ids = np.sort(q_ids, axis=1), np.sort(kv_ids, axis=1)
        ours["q_segment_ids"] = ref["q_segment_ids"] = q_ids.astype(np.int32)
        ours["kv_segment_ids"] = ref["kv_segment_ids"] = kv_ids.astype(np.int32)
    if "softcap" in case:
        ours["logits_soft_cap"] = ref["logits_soft_cap"] = case["softcap"]
    if "scale" in case:
        ours["scale"] = ref["scale"] = case["scale"]
    if "dropout" in case:
        rate, shared = case["dropout"]
        key = jax.random.key(seed)
        ours.update(dropout_rate=rate, dropout_rng=key, dropout_broadcast=shared)
        words = np.asarray(jax.random.bits(key, (2,), jnp.uint32))
        factor = reference.dropout_factor(words, b, n, t, s, rate, shared)
        ref["dropout_factor"] = factor
    return q, k, v, bias, dout, ours, ref


def probabilities(q, k, bias, ref_kwargs):
    """P * F and P ([B, N, T, S], F the dropout factors): the reference with
    one-hot values."""
    b, s, kh = k.shape[:3]
    eye = jnp.broadcast_to(jnp.eye(s, dtype=q.dtype)[None, :, None, :], (b, s, kh, s))
    probs = lambda kw: jnp.swapaxes(reference.attention(q, k, eye, bias, **kw), 1, 2)
    pf = probs(ref_kwargs)
    if "dropout_factor" not in ref_kwargs:
        return pf, pf
    return pf, probs({name: x for name, x in ref_kwargs.items() if name != "dropout_factor"})


def term_magnitudes(q, k, v, bias, dout, out, pf, p, scale):
    """Per element of dq, dk, dv (and dbias): the sum of the absolute values
    of the terms it sums, in float64 (NumPy).

    A gradient can cancel to ~0 while its terms do not: a bias broadcast over
    keys has dbias_i = sum_j dS_ij = 0 up to rounding (dS = P * (F * dP - delta),
    with delta = dout . out from the rounded output), and a row that sees one
    key has dq = 0. Rounding errors scale with these magnitudes, not with the
    (vanishing) result, so they join the comparison's scale.
    """
    b, t, n, h = q.shape
    s, kh = k.shape[1], k.shape[2]
    group = n // kh
    q, k, v, dout, out, pf, p = (np.asarray(x) for x in (q, k, v, dout, out, pf, p))
    k_rep, v_rep = (np.repeat(x, group, axis=2) for x in (k, v))
    dp = np.abs(np.einsum("btnh,bsnh->bnts", dout, v_rep))
    delta = np.einsum("btnh->bnt", np.abs(dout * out))
    ds = pf * dp + p * delta[..., None]  # [B, N, T, S]
    scale = abs(scale)
    mags = [
        scale * np.einsum("bnts,bsnh->btnh", ds, np.abs(k_rep)),
        scale * np.einsum("bnts,btnh->bsnh", ds, np.abs(q)).reshape(b, s, kh, group, h).sum(3),
        np.einsum("bnts,btnh->bsnh", pf, np.abs(dout)).reshape(b, s, kh, group, h).sum(3),
    ]
    if bias is not None:
        shape = (1,) * (4 - bias.ndim) + bias.shape
        axes = tuple(i for i, size in enumerate(shape) if size == 1)
        mags.append(ds.sum(axis=axes, keepdims=True).reshape(bias.shape))
    return mags


def assert_grad_close(name, actual, expected, magnitude, dtype):
    """assert_close's rule for gradients (tolerance x (max|expected| +
    |expected|)), plus ROUNDING_ULPS ulps of the input dtype times each
    element's term magnitude: what rounding the inputs, the output (delta) or
    dS to that dtype can leave in a sum that cancels."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert np.all(np.isfinite(actual)), f"{name}: non-finite values (unwritten or overflow)"
    tol = TOLERANCE[jnp.dtype(dtype)] * GRAD_FACTOR
    err = np.abs(actual - expected)
    ulp = float(jnp.finfo(dtype).eps)
    bound = tol * (np.max(np.abs(expected)) + np.abs(expected)) + ROUNDING_ULPS * ulp * magnitude
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (
        f"{name} ({jnp.dtype(dtype).name}): max error {err.max():.3g}; worst at {worst}: "
        f"{actual[worst]} vs {expected[worst]} (allowance {bound[worst]:.3g}, terms "
        f"{magnitude[worst]:.3g}, max|expected| {np.max(np.abs(expected)):.3g})"
    )


def check_case(case, seed):
    q, k, v, bias, dout, ours, ref = build(case, seed)
    dtype = case["dtype"]
    acc = jnp.promote_types(dtype, jnp.float32)
    argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)

    # Array arguments go in as jit arguments (not baked-in constants, which
    # XLA would constant-fold at compile time); the static ones stay closed over.
    split = lambda kw: ({n: x for n, x in kw.items() if isinstance(x, np.ndarray)},
                        {n: x for n, x in kw.items() if not isinstance(x, np.ndarray)})
    our_arrays, our_static = split(ours)
    ref_arrays, ref_static = split(ref)

    @jax.jit
    def run(q, k, v, bias, dout, arrays):
        def loss(q, k, v, bias):
            out, lse = jax_flash.attention(q, k, v, bias, return_residual=True, **arrays,
                                           **our_static)
            return jnp.sum(out.astype(acc) * dout.astype(acc)), (out, lse)

        grads, (out, lse) = jax.grad(loss, argnums, has_aux=True)(q, k, v, bias)
        return out, lse, grads

    def run_reference(q, k, v, bias, dout, arrays):
        kwargs = {**arrays, **ref_static}

        def loss(q, k, v, bias):
            out, lse = reference.attention(q, k, v, bias, return_residual=True, **kwargs)
            return jnp.sum(out * dout), (out, lse)

        grads, (out, lse) = jax.grad(loss, argnums, has_aux=True)(q, k, v, bias)
        return out, lse, grads, probabilities(q, k, bias, kwargs)

    f64 = lambda x: None if x is None else np.asarray(x, np.float64)
    out, lse, grads = run(q, k, v, bias, dout, our_arrays)
    assert out.shape == q.shape and out.dtype == q.dtype
    for name, g, x in zip(("dq", "dk", "dv", "dbias"), grads, (q, k, v, bias)):
        assert g.shape == x.shape and g.dtype == x.dtype, name
    out, grads = f64(out), [f64(g) for g in grads]
    args64 = (f64(q), f64(k), f64(v), f64(bias), f64(dout))
    # The float64 reference compiles without LLVM optimizations: half the
    # compile time, which dominates these small cases.
    ref_fn = jax.jit(run_reference).lower(*args64, ref_arrays).compile(
        {"xla_backend_optimization_level": 0})
    ref_out, ref_lse, ref_grads, (pf, p) = ref_fn(*args64, ref_arrays)

    assert_close("out", out, ref_out, dtype)
    visible = np.isfinite(np.asarray(ref_lse))  # [B, N, T]: rows that see a key
    got_lse = np.swapaxes(np.asarray(lse, np.float64), -1, -2)
    assert np.all(np.isneginf(got_lse[~visible])), "rows that see no key must report lse = -inf"
    assert_close("lse", np.where(visible, got_lse, 0), np.where(visible, ref_lse, 0), dtype)
    scale = ref.get("scale", 1 / np.sqrt(case["H"]))
    mags = term_magnitudes(*args64, ref_out, pf, p, scale)
    for name, g, r, m in zip(("dq", "dk", "dv", "dbias"), grads, ref_grads, mags):
        assert_grad_close(name, g, r, m, dtype)


def _run(case, seed, label):
    if ON_GPU and case["dtype"] == "float64":
        return "skipped (float64 on the GPU)"
    try:
        check_case(case, seed)
    except AssertionError as e:
        raise AssertionError(f"{label}: case {case!r} (data seed {seed}) failed: {e}") from e


@pytest.mark.parametrize("seed", SEEDS)
def test_random_cases(seed):
    rng = np.random.default_rng(1000 + seed)
    for i in range(CASES_PER_SEED):
        case = draw_case(rng)
        _run(case, int(rng.integers(1 << 31)), f"seed {seed}, case {i}")


@pytest.mark.parametrize("index", range(len(REGRESSIONS)))
def test_regressions(index):
    _run(REGRESSIONS[index], 7 + index, f"REGRESSIONS[{index}]")


def test_draws_cover_the_space():
    """The drawn cases reach every dtype, odd head dims, GQA and every feature."""
    rng_cases = []
    for seed in SEEDS:
        rng = np.random.default_rng(1000 + seed)
        for _ in range(CASES_PER_SEED):
            rng_cases.append(draw_case(rng))
            rng.integers(1 << 31)
    assert {c["dtype"] for c in rng_cases} == set(DTYPES)
    assert any(c["H"] % 2 for c in rng_cases) and any(c["N"] > c["K"] for c in rng_cases)
    for feature in ("causal", "window", "q_lengths", "kv_lengths", "segments", "mask", "bias",
                    "softcap", "dropout"):
        assert any(feature in c for c in rng_cases), feature
    assert {c["segments"] for c in rng_cases if "segments" in c} == {"sorted", "unsorted"}


@pytest.mark.skipif(ON_GPU, reason="float64 runs on the CPU only")
def test_float64_dropout_scale():
    """float64 with dropout against the exact 1 / (1 - rate): 1e-10, not 6e-8."""
    b, t, s, n, h, rate = 1, 8, 40, 1, 4, 0.3
    rng = np.random.default_rng(5)
    q, k, v = (jnp.asarray(rng.standard_normal((b, length, n, h))) for length in (t, s, s))
    key = jax.random.key(3)
    words = np.asarray(jax.random.bits(key, (2,), jnp.uint32))
    factor = to_f64_cpu(reference.dropout_factor(words, b, n, t, s, rate))
    out = jax_flash.attention(q, k, v, dropout_rate=rate, dropout_rng=key)
    assert_close("out", out, reference.attention(q, k, v, dropout_factor=factor), "float64")
