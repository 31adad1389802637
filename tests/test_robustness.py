"""Robustness: NaN/Inf inputs stay confined to the outputs they reach, huge
logits stay finite, empty batches work (and zero heads is a clear error),
concurrent calls from Python threads, a failing kernel launch is an error
that names the kernel and the shape and leaves the process working, and the
compiled memory of forward + backward at T = 128k is O(T) (no T x T
buffer)."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash import _ffi, reference
from helpers import CPU, GRAD_FACTOR, ON_GPU, TOLERANCE, assert_close

B, T, S, N, K, H = 2, 70, 90, 4, 2, 16
ROW_B, ROW_Q, ROW_N, ROW_K, ROW_KH = 0, 37, 1, 51, 1  # the poisoned rows

FEATURES = {
    "plain": {},
    "causal": dict(is_causal=True),
    "window": dict(local_window_size=(10, 5)),
    "kv_lengths": dict(key_value_seq_lengths=np.array([40, S], np.int32)),  # key 51 is padding in batch 0
    "key_padding_mask": dict(mask=np.arange(S)[None, None, None, :] % 3 != 0),
    "segments": dict(q_segment_ids=np.repeat([[0, 1]], T // 2, 1).astype(np.int32).repeat(B, 0),
                     kv_segment_ids=(np.arange(S)[None, :] >= 45).astype(np.int32).repeat(B, 0)),
}


def _inputs(rng, dtype, where, value):
    q = rng.standard_normal((B, T, N, H))
    k = rng.standard_normal((B, S, K, H))
    v = rng.standard_normal((B, S, K, H))
    if where == "query":
        q[ROW_B, ROW_Q, ROW_N, :] = value
    else:
        k[ROW_B, ROW_K, ROW_KH, :] = value
    return tuple(x.astype(dtype) for x in (q, k, v))


def _expected(q, k, v, kwargs):
    """The reference output, NaN where a row's visible logits hold a NaN or a
    +inf (softmax is then NaN: inf - inf). The reference itself returns zeros
    for every row whose logsumexp is not finite (its "no visible key" rule),
    so its lse, not its output, marks the rows; a -inf logit just hides that
    key."""
    f64 = [jax.device_put(np.asarray(x, np.float64), CPU) for x in (q, k, v)]
    out, lse = reference.attention(*f64, return_residual=True, **kwargs)
    out, lse = np.array(out), np.asarray(lse)  # lse [B, N, T]
    poisoned = np.isnan(lse) | (lse == np.inf)
    out[np.swapaxes(poisoned, 1, 2)] = np.nan
    return out, np.swapaxes(poisoned, 1, 2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["query", "key"])
@pytest.mark.parametrize("features", list(FEATURES))
def test_nan_and_inf_rows_reach_exactly_the_rows_that_see_them(rng, features, where, value, dtype):
    """One query row or one key row all NaN / +inf / -inf: NaN exactly in the
    output rows whose visible logits it turns NaN (a key hidden by a mask,
    a length, the window or the causal rule reaches no row), the reference's
    values everywhere else, and a backward that does not crash and leaves
    the other batch entries and head groups finite.

    (Not tested: a NaN *value* row. Its probability is 0 in rows that do not
    see it, and 0 * NaN is NaN in the P @ V product, here as in the
    reference and XLA's attention, so which rows it reaches depends on which
    blocks a kernel skips.)"""
    q, k, v = _inputs(rng, dtype, where, value)
    kwargs = FEATURES[features]
    want, poisoned_rows = _expected(q, k, v, kwargs)
    got = np.asarray(jax_flash.attention(q, k, v, **kwargs), np.float64)
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    assert np.array_equal(nan_got, nan_want), (
        f"NaN in {np.argwhere(nan_got & ~nan_want)[:5].tolist()} (unexpected), "
        f"missing at {np.argwhere(nan_want & ~nan_got)[:5].tolist()}")
    # Only the poisoned (batch, head) can hold NaN; a NaN query row poisons itself only.
    rows = np.argwhere(poisoned_rows)
    assert all(b == ROW_B for b, _, _ in rows)
    if where == "query":
        assert {(i, n) for _, i, n in rows} <= {(ROW_Q, ROW_N)}
    else:
        assert {n // (N // K) for _, _, n in rows} <= {ROW_KH}
    if where == "query" and np.isnan(value):
        assert len(rows) == 1  # a NaN query row is NaN whatever it sees
    if where == "key" and np.isnan(value) and features in ("kv_lengths", "key_padding_mask"):
        assert len(rows) == 0, "a NaN in a masked (padding) key must not reach any row"
    if where == "key" and np.isnan(value) and features == "plain":
        assert len(rows) == T * (N // K)  # every row of the key's head group sees it
    if where == "key" and np.isnan(value) and features == "causal":
        assert len(rows) == (T - ROW_K) * (N // K)  # rows i >= 51 only
    finite = ~nan_want
    assert_close("out", np.where(finite, got, 0), np.where(finite, want, 0), dtype)

    # The backward must not crash, and nothing outside the poisoned
    # (batch, key head group) may turn non-finite.
    dout = jnp.asarray(rng.standard_normal(q.shape), dtype)
    grads = jax.grad(lambda q, k, v: jnp.sum(
        jax_flash.attention(q, k, v, **kwargs).astype(jnp.float32) * dout.astype(jnp.float32)),
        (0, 1, 2))(q, k, v)
    for name, g in zip(("dq", "dk", "dv"), grads):
        g = np.asarray(g, np.float64)
        clean = np.ones(g.shape, bool)
        clean[ROW_B, :, _poisoned_heads(name, where), :] = False
        assert np.all(np.isfinite(g[clean])), f"{name}: non-finite outside the poisoned batch and heads"


def _poisoned_heads(name, where):
    """The heads of gradient `name` that a poisoned row may reach (in batch ROW_B)."""
    group = N // K
    if where == "query":  # query head ROW_N, its key head ROW_N // group
        return slice(ROW_N, ROW_N + 1) if name == "dq" else slice(ROW_N // group, ROW_N // group + 1)
    # key head ROW_KH: the query heads of its group
    return slice(ROW_KH * group, (ROW_KH + 1) * group) if name == "dq" else slice(ROW_KH, ROW_KH + 1)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("features", ["plain", "causal", "shifted"])
def test_huge_logits_stay_finite(rng, dtype, features):
    """|q.k| ~ 1e4 (scale 1): output, logsumexp and every gradient finite; the
    output, logsumexp and dv match the float64 reference.

    A float32 logit x is only known to ~u |x| (u = 2^-24; the kernels also
    fold log2(e) into it before subtracting the row max), so probabilities
    carry a relative error ~u |x| that the tolerance adds: at |x| ~ 3e4 that
    is 2e-3, far above float32's usual 2e-5. dq and dk of a near one-hot
    softmax amplify it further (their dS cancels), so they are checked finite.
    """
    b, t, s, n, h = 1, 70, 90, 2, 16
    q = (30 * rng.standard_normal((b, t, n, h))).astype(dtype)
    k = (30 * rng.standard_normal((b, s, 1, h))).astype(dtype)
    v = rng.standard_normal((b, s, 1, h)).astype(dtype)
    dout = rng.standard_normal(q.shape).astype(dtype)
    kwargs = dict(scale=1.0, is_causal=features == "causal")
    # "shifted": every logit moved by -3e4 through a bias (softmax is shift invariant).
    bias = np.full((1, 1, 1, s), -3e4, np.float32) if features == "shifted" else None
    f64 = [jax.device_put(np.asarray(x, np.float64), CPU) for x in (q, k, v, dout)]
    logits = np.einsum("btnh,bsh->bnts", f64[0], f64[1][:, :, 0])
    assert 1e4 < np.abs(logits).max() < 5e4
    x_max = np.log2(np.e) * np.abs(logits + (0 if bias is None else bias)).max()
    rounding = 4 * 2.0**-24 * x_max  # relative error of the probabilities (float32 logits)

    out, lse = jax_flash.attention(q, k, v, bias, return_residual=True, **kwargs)
    ref_out, ref_lse = reference.attention(*f64[:3], bias, return_residual=True, **kwargs)
    _assert_close_with(rounding * np.abs(np.asarray(v, np.float64)).max(), "out", out, ref_out, dtype)
    assert_close("lse", np.swapaxes(np.asarray(lse, np.float64), 1, 2), ref_lse, dtype)

    grads = jax.grad(lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v, bias, **kwargs).astype(
        jnp.float32) * dout.astype(np.float32)), (0, 1, 2))(q, k, v)
    ref_dv = jax.grad(lambda v: jnp.sum(
        reference.attention(*f64[:2], v, bias, **kwargs) * f64[3]))(f64[2])
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert np.all(np.isfinite(np.asarray(g, np.float64))), name
    _assert_close_with(rounding * np.abs(np.asarray(ref_dv)).max(), "dv", grads[2], ref_dv, dtype,
                       GRAD_FACTOR)


def _assert_close_with(allowance, name, actual, expected, dtype, factor=1.0):
    """assert_close, with `allowance` added to every element's bound."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert np.all(np.isfinite(actual)), f"{name}: non-finite values"
    tol = TOLERANCE[jnp.dtype(dtype)] * factor
    bound = tol * (np.abs(expected).max() + np.abs(expected)) + allowance
    err = np.abs(actual - expected)
    assert np.all(err <= bound), f"{name} ({dtype}): max error {err.max():.3g}, bound {bound.min():.3g}"


def test_empty_batch_gives_empty_results(rng):
    """B = 0 works (with features, under jit, grad and vmap) and returns empty arrays."""
    q = jnp.zeros((0, 8, 2, 4), jnp.float32)
    kv = jnp.zeros((0, 12, 1, 4), jnp.float32)
    features = dict(bias=jnp.zeros((0, 2, 8, 12)), mask=jnp.ones((0, 1, 1, 12), bool),
                    is_causal=True, key_value_seq_lengths=jnp.zeros((0,), jnp.int32),
                    q_segment_ids=jnp.zeros((0, 8), jnp.int32),
                    kv_segment_ids=jnp.zeros((0, 12), jnp.int32),
                    dropout_rate=0.1, dropout_rng=jax.random.key(0))
    out, lse = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, return_residual=True,
                                                           **features))(q, kv, kv)
    assert out.shape == (0, 8, 2, 4) and lse.shape == (0, 8, 2)
    bias = features.pop("bias")
    grads = jax.grad(lambda q, k, v, b: jnp.sum(jax_flash.attention(q, k, v, b, **features)),
                     (0, 1, 2, 3))(q, kv, kv, bias)
    assert [g.shape for g in grads] == [q.shape, kv.shape, kv.shape, bias.shape]
    # vmap over an empty axis hands the kernels a zero-size leading dim.
    per_example = jnp.zeros((0, 1, 8, 2, 4))
    assert jax.vmap(jax_flash.attention)(per_example, per_example, per_example).shape == per_example.shape
    assert jax.grad(lambda q: jnp.sum(jax.vmap(jax_flash.attention)(q, q, q)))(per_example).shape == (
        per_example.shape)


@pytest.mark.parametrize("q_heads, kv_heads, match", [
    (0, 0, r"query must have at least one head"),
    (0, 2, r"query must have at least one head"),
    (2, 0, r"key must have at least one head"),
])
def test_zero_heads_is_a_trace_time_error(q_heads, kv_heads, match):
    q = jax.ShapeDtypeStruct((1, 8, q_heads, 4), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, 8, kv_heads, 4), jnp.float32)
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(jax_flash.attention, q, kv, kv)  # no compile, no kernel


def test_concurrent_calls_from_threads(rng):
    """Two threads run the same jitted forward + backward at once; each result
    equals the sequential one bitwise (the CPU kernels are deterministic)."""
    kwargs = dict(is_causal=True, mask=jnp.asarray(rng.random((2, 1, 1, 96)) < 0.8),
                  dropout_rate=0.2, dropout_rng=jax.random.key(1))
    step = jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(
        jax_flash.attention(q, k, v, **kwargs) ** 2), (0, 1, 2)))
    inputs = [tuple(jnp.asarray(rng.standard_normal(shape), jnp.float32)
                    for shape in ((2, 96, 4, 32), (2, 96, 2, 32), (2, 96, 2, 32)))
              for _ in range(6)]
    want = [jax.block_until_ready(step(*x)) for x in inputs]  # sequential (and compiled)

    got, errors = {}, []
    barrier = threading.Barrier(2)

    def worker(index):
        try:
            barrier.wait()
            for _ in range(3):
                for i in range(index, len(inputs), 2):
                    got.setdefault(i, []).append(jax.block_until_ready(step(*inputs[i])))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert sorted(got) == list(range(len(inputs)))
    for i, results in got.items():
        assert len(results) == 3
        for result in results:
            for a, b in zip(jax.tree.leaves(result), jax.tree.leaves(want[i])):
                if ON_GPU:
                    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
                else:
                    np.testing.assert_array_equal(a, b)


@pytest.fixture
def inject_launch_failures():
    """jax_flash._ffi.inject_launch_failures, always reset after the test."""
    yield _ffi.inject_launch_failures
    _ffi.inject_launch_failures(0)


# Whatever the platform and kernel family: the launcher's or the CPU
# kernel's message, then the shape (B=.., Tq=.., ...).
INJECTED = r"injected failure \(test hook\)[\s\S]*Tq=48"


def test_a_failing_launch_is_an_error_and_the_next_call_works(rng, inject_launch_failures):
    """A kernel launch that fails (here by the test hook, which takes the
    same road as a real CUDA or C++ failure: the launcher's message, an
    ffi::Error, an exception) raises in Python with the kernel and the shape
    named, in the forward, the backward and the paged forward; the calls
    after it run and give the same results as before."""
    dtype = jnp.bfloat16 if ON_GPU else jnp.float32
    q, k, v = (jnp.asarray(rng.standard_normal((2, 48, 4, 64)), dtype) for _ in range(3))
    forward = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, is_causal=True))
    want = jax.block_until_ready(forward(q, k, v))
    inject_launch_failures(1)
    with pytest.raises(Exception, match=INJECTED):
        jax.block_until_ready(forward(q, k, v))
    np.testing.assert_array_equal(forward(q, k, v), want)

    out, vjp = jax.vjp(jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, is_causal=True)), q, k, v)
    cotangent = jnp.asarray(rng.standard_normal(out.shape), dtype)
    backward = jax.jit(vjp)
    want_grads = jax.block_until_ready(backward(cotangent))
    inject_launch_failures(1)  # the forward has run: this is the backward's launch
    with pytest.raises(Exception, match=INJECTED):
        jax.block_until_ready(backward(cotangent))
    for got, expected in zip(backward(cotangent), want_grads):
        if ON_GPU:  # the default CUDA backward adds dQ by float32 atomics: any order
            np.testing.assert_allclose(np.float32(got), np.float32(expected), rtol=1e-2, atol=1e-2)
        else:
            np.testing.assert_array_equal(got, expected)

    pool = jnp.asarray(rng.standard_normal((2, 4, 16, 2, 64)), dtype)  # [k/v, blocks, block, K, H]
    tables = jnp.asarray([[0, 1], [2, 3]], jnp.int32)
    lengths = jnp.asarray([20, 32], jnp.int32)
    query = jnp.asarray(rng.standard_normal((2, 48, 4, 64))[:, :1], dtype)
    paged = jax.jit(jax_flash.paged_attention)
    want_paged = jax.block_until_ready(paged(query, pool[0], pool[1], tables, lengths))
    inject_launch_failures(1)
    # (the CUDA decode launcher names the shape its own way: "seqlen_q 1")
    with pytest.raises(Exception, match=r"injected failure \(test hook\)[\s\S]*(Tq=1|seqlen_q 1)\b"):
        jax.block_until_ready(paged(query, pool[0], pool[1], tables, lengths))
    np.testing.assert_array_equal(paged(query, pool[0], pool[1], tables, lengths), want_paged)


@pytest.mark.parametrize("features", ["plain", "causal_padding_segments"])
def test_compiled_memory_is_linear_in_sequence_length(features):
    """Forward + backward at T = 128k: the compiled temp memory is a few
    [T, N, H] buffers, far below one T x T float32 matrix (64 GiB). Compiled
    only, never run; XLA's own attention is the control (it has T x T buffers)."""
    t, n, h = 131072, 1, 32
    spec = jax.ShapeDtypeStruct((1, t, n, h), jnp.float32)
    extra = {}
    if features != "plain":
        extra = dict(is_causal=True, mask=jax.ShapeDtypeStruct((1, 1, 1, t), jnp.bool_),
                     q_segment_ids=jax.ShapeDtypeStruct((1, t), jnp.int32),
                     kv_segment_ids=jax.ShapeDtypeStruct((1, t), jnp.int32))
    arrays = {name: x for name, x in extra.items() if isinstance(x, jax.ShapeDtypeStruct)}
    static = {name: x for name, x in extra.items() if name not in arrays}

    def step(attention):
        return jax.jit(jax.value_and_grad(lambda q, k, v, arrays: jnp.sum(
            attention(q, k, v, **arrays, **static) ** 2), (0, 1, 2)))

    temp = step(jax_flash.attention).lower(spec, spec, spec, arrays).compile().memory_analysis()
    buffer = t * n * h * 4  # one [T, N, H] float32 array
    assert temp is not None and temp.temp_size_in_bytes < 8 * buffer, temp
    assert temp.temp_size_in_bytes < t * t * 4 / 1000

    if features == "plain":  # the control: memory_analysis does see a T x T buffer
        # Compiled for the CPU: a GPU compile would try to allocate the 64 GiB to autotune.
        on_cpu = jax.ShapeDtypeStruct(spec.shape, spec.dtype,
                                      sharding=jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0]))
        xla = step(jax.nn.dot_product_attention).lower(on_cpu, on_cpu, on_cpu, {}).compile()
        assert xla.memory_analysis().temp_size_in_bytes >= t * t * 4
