"""Attention sinks (issue 19): `sinks` [N], one logit per query head in every
row's softmax denominator with no value. Forward, lse and gradients (dq, dk,
dv, dbias and dsinks through jax.grad) against the float64 reference, which
takes the sinks as an extra key column of value zero; with the masks that
leave rows empty, GQA, dropout, vmap and jit; the argument errors. On a GPU
each case also runs through the generic kernels and with deterministic=True."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash import reference
from helpers import GRAD_FACTOR, ON_GPU, assert_close, random_qkv, to_f64_cpu

B, T, S, N, K, H = 2, 37, 70, 4, 2, 32

MODES = [(None, False), ("generic", False), (None, True)] if ON_GPU else [(None, False)]


def _case(name, rng):
    """Keyword arguments (a bias among them) of one feature combination."""
    seg = lambda n: jnp.asarray(np.sort(rng.integers(0, 3, (B, n)), axis=1), jnp.int32)
    cases = {
        "plain": {},
        "causal": dict(is_causal=True),
        # Query rows past a length and keys past a length: padded rows see no key.
        "lengths": dict(query_seq_lengths=jnp.array([T, 20], jnp.int32),
                        key_value_seq_lengths=jnp.array([12, S], jnp.int32)),
        # A window, and batch entry 1 with no keys at all: every one of its rows is empty.
        "window_empty_rows": dict(local_window_size=(10, 0), key_value_seq_lengths=jnp.array([S, 0], jnp.int32)),
        "segments": dict(q_segment_ids=seg(T), kv_segment_ids=seg(S), is_causal=True),
        "bias_soft_cap": dict(bias=jnp.asarray(rng.standard_normal((1, N, T, S)), jnp.float32),
                              logits_soft_cap=2.0),
    }
    return dict(cases[name])


def _sinks(rng):
    # Above the logits' typical range (standard normal q.k / sqrt(H), a bias),
    # so that each sink takes a real share (~5-20%) of a row of 70 keys.
    return jnp.asarray(rng.standard_normal(N) + 3.0, jnp.float32)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"{m[0] or 'auto'}{'-det' if m[1] else ''}")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("case", ["plain", "causal", "lengths", "window_empty_rows", "segments", "bias_soft_cap"])
def test_sinks_forward_and_gradients(rng, case, dtype, mode):
    if ON_GPU and dtype == "float64":
        pytest.skip("float64 runs on the CPU only")
    q, k, v = random_qkv(rng, B, T, S, N, K, H, dtype)
    kwargs = _case(case, rng)
    bias = kwargs.pop("bias", None)
    acc = jnp.promote_types(dtype, jnp.float32)
    sinks = _sinks(rng).astype(acc)
    if bias is not None:
        bias = bias.astype(acc)
    dout = jnp.asarray(rng.standard_normal(q.shape), dtype)
    ours = dict(kwargs, implementation=mode[0], deterministic=mode[1])
    ref_kwargs = dict(kwargs)
    if "logits_soft_cap" in ref_kwargs:
        ref_kwargs["logits_soft_cap"] = float(ref_kwargs["logits_soft_cap"])

    out, res = jax_flash.attention(q, k, v, bias, return_residual=True, sinks=sinks, **ours)
    f64 = lambda x: None if x is None else to_f64_cpu(x)  # noqa: E731
    ref_out, ref_lse = reference.attention(f64(q), f64(k), f64(v), f64(bias), return_residual=True,
                                           sinks=f64(sinks), **ref_kwargs)
    assert_close("out", out, ref_out, dtype)
    # With sinks every row's lse is finite: the sink's logit where no key is visible.
    assert_close("lse", np.swapaxes(np.asarray(res, np.float64), -1, -2), ref_lse, dtype)
    ref_plain, plain_lse = reference.attention(f64(q), f64(k), f64(v), f64(bias), return_residual=True,
                                               **ref_kwargs)
    # The sinks change the result (the test would pass without them otherwise).
    assert np.max(np.abs(np.asarray(ref_out) - np.asarray(ref_plain))) > 1e-2 * np.max(np.abs(ref_plain))
    if case in ("lengths", "window_empty_rows"):
        empty = ~np.isfinite(np.asarray(plain_lse))
        assert empty.any(), "the case must leave rows with no visible key"
        out_bnt = np.moveaxis(np.asarray(out, np.float64), 1, 2)  # [B, N, T, H]
        assert np.all(out_bnt[empty] == 0), "rows that see no key return zeros with sinks too"

    def loss(fn, q, k, v, b, sk, **kw):
        return jnp.sum(fn(q, k, v, b, sinks=sk, **kw).astype(acc) * dout.astype(acc))

    argnums = (0, 1, 2, 4) if bias is None else (0, 1, 2, 4, 3)
    grads = jax.grad(lambda *a: loss(jax_flash.attention, *a, **ours), argnums)(q, k, v, bias, sinks)
    ref_grads = jax.grad(lambda *a: jnp.sum(reference.attention(*a[:4], sinks=a[4], **ref_kwargs)
                                            * f64(dout)), argnums)(f64(q), f64(k), f64(v), f64(bias), f64(sinks))
    for name, g, r in zip(("dq", "dk", "dv", "dsinks", "dbias"), grads, ref_grads):
        assert_close(name, g, r, dtype, factor=GRAD_FACTOR)
    assert grads[3].shape == (N,) and grads[3].dtype == sinks.dtype
    assert np.max(np.abs(np.asarray(grads[3]))) > 0, "dsinks must not vanish"


def test_sinks_with_dropout(rng):
    # Dropout scales the kept probabilities after the softmax: the sinks join the denominator only.
    q, k, v = random_qkv(rng, B, T, S, N, K, H, "float32")
    sinks = _sinks(rng)
    seed = jax.random.key(3)
    rate = 0.25
    dout = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    factor = reference.dropout_factor(np.asarray(jax.random.bits(seed, (2,), jnp.uint32)), B, N, T, S, rate)
    kw = dict(is_causal=True, dropout_rate=rate, dropout_rng=seed)

    def ours(q, k, v, sk):
        return jnp.sum(jax_flash.attention(q, k, v, sinks=sk, **kw) * dout)

    def ref(q, k, v, sk):
        return jnp.sum(reference.attention(q, k, v, sinks=sk, is_causal=True,
                                           dropout_factor=to_f64_cpu(factor)) * to_f64_cpu(dout))

    out = jax_flash.attention(q, k, v, sinks=sinks, **kw)
    ref_out = reference.attention(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), sinks=to_f64_cpu(sinks),
                                  is_causal=True, dropout_factor=to_f64_cpu(factor))
    assert_close("out", out, ref_out, jnp.float32)
    grads = jax.grad(ours, (0, 1, 2, 3))(q, k, v, sinks)
    ref_grads = jax.grad(ref, (0, 1, 2, 3))(*(to_f64_cpu(x) for x in (q, k, v, sinks)))
    for name, g, r in zip(("dq", "dk", "dv", "dsinks"), grads, ref_grads):
        assert_close(name, g, r, jnp.float32, factor=GRAD_FACTOR)


def test_sinks_vmap_jit_and_unbatched(rng):
    # vmap over a stack of sinks (one per model replica) and over the batch; jit; [T, N, H] inputs.
    q, k, v = random_qkv(rng, B, T, S, N, K, H, "float32")
    stack = jnp.stack([_sinks(rng) for _ in range(3)])  # [3, N]
    fn = jax.jit(jax.vmap(lambda sk: jax_flash.attention(q, k, v, sinks=sk, is_causal=True)))
    got = fn(stack)
    for i in range(3):
        want = reference.attention(*(to_f64_cpu(x) for x in (q, k, v)), sinks=to_f64_cpu(stack[i]),
                                   is_causal=True)
        assert_close(f"vmapped out {i}", got[i], want, jnp.float32)
    sinks = stack[0]
    per_example = jax.vmap(lambda q1, k1, v1: jax_flash.attention(q1, k1, v1, sinks=sinks))(q, k, v)
    assert_close("unbatched under vmap", per_example,
                 reference.attention(*(to_f64_cpu(x) for x in (q, k, v)), sinks=to_f64_cpu(sinks)), jnp.float32)
    dsinks = jax.jit(jax.grad(lambda sk: jnp.sum(jax.vmap(
        lambda q1, k1, v1: jax_flash.attention(q1, k1, v1, sinks=sk))(q, k, v) ** 2)))(sinks)
    want = jax.grad(lambda sk: jnp.sum(reference.attention(
        *(to_f64_cpu(x) for x in (q, k, v)), sinks=sk) ** 2))(to_f64_cpu(sinks))
    assert_close("dsinks under vmap", dsinks, want, jnp.float32, factor=GRAD_FACTOR)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sinks_far_from_the_logits(rng, dtype):
    """Sinks far above the logits (exp(80) overflows float32: the sink's
    share must be taken against max(row max, sink)) and far below them,
    each head against the float64 reference on its own scale, with rows
    that see no key among them (zeros, the sink as their lse)."""
    q, k, v = random_qkv(rng, B, T, S, N, K, H, dtype)
    sinks = jnp.array([80.0, -80.0, 0.0, 30.0], jnp.float32)
    lengths = jnp.array([S, 0], jnp.int32)  # batch entry 1 sees no key
    out, lse = jax_flash.attention(q, k, v, sinks=sinks, key_value_seq_lengths=lengths, return_residual=True)
    ref_out, ref_lse = reference.attention(*(to_f64_cpu(x) for x in (q, k, v)), sinks=to_f64_cpu(sinks),
                                           key_value_seq_lengths=lengths, return_residual=True)
    for n in range(N):  # each head on its own scale: the first one's outputs are ~1e-34
        assert_close(f"out, head {n}", out[0, :, n], ref_out[0, :, n], dtype)
        assert_close(f"lse, head {n}", np.asarray(lse, np.float64)[0, :, n], ref_lse[0, n], dtype)
    assert np.all(np.asarray(out)[1] == 0)
    np.testing.assert_allclose(np.asarray(lse, np.float64)[1], np.broadcast_to(np.asarray(sinks), (T, N)),
                               rtol=1e-2 if dtype == "bfloat16" else 1e-6)


@pytest.mark.parametrize("tq,s", [(1, 4096), (16, 2048)])
def test_sinks_decode_shapes(rng, tq, s):
    """A few queries over many keys (on CUDA the split-KV decode kernels and
    the combine of their splits, with the sinks), GQA, one batch entry with
    no keys at all (zeros, the sink as its lse), against the reference."""
    q, k, v = random_qkv(rng, 2, tq, s, 4, 2, 64, "bfloat16")
    sinks = jnp.asarray(rng.standard_normal(4) + 3.0, jnp.float32)
    lengths = jnp.array([s - 5, 0], jnp.int32)
    out, lse = jax_flash.attention(q, k, v, sinks=sinks, key_value_seq_lengths=lengths, return_residual=True)
    ref_out, ref_lse = reference.attention(*(to_f64_cpu(x) for x in (q, k, v)), sinks=to_f64_cpu(sinks),
                                           key_value_seq_lengths=lengths, return_residual=True)
    assert_close("out", out, ref_out, "bfloat16")
    assert_close("lse", np.swapaxes(np.asarray(lse, np.float64), -1, -2), ref_lse, "bfloat16")
    assert np.all(np.asarray(out)[1] == 0)


def test_minus_inf_sinks_are_no_sinks(rng):
    # A head whose sink is -inf attends as without sinks (and its gradient stays finite: zero).
    q, k, v = random_qkv(rng, B, T, S, N, K, H, "float32")
    sinks = jnp.array([-jnp.inf, 0.5, -jnp.inf, 1.0], jnp.float32)
    lengths = jnp.array([S, 0], jnp.int32)  # batch entry 1 sees no key: lse -inf with a -inf sink
    out, lse = jax_flash.attention(q, k, v, sinks=sinks, key_value_seq_lengths=lengths, return_residual=True)
    plain, plain_lse = jax_flash.attention(q, k, v, key_value_seq_lengths=lengths, return_residual=True)
    np.testing.assert_array_equal(np.asarray(out)[:, :, 0::2], np.asarray(plain)[:, :, 0::2])
    np.testing.assert_array_equal(np.asarray(lse)[..., 0::2], np.asarray(plain_lse)[..., 0::2])
    assert np.all(np.asarray(out)[1] == 0)
    grads = jax.grad(lambda sk: jnp.sum(jax_flash.attention(q, k, v, sinks=sk, key_value_seq_lengths=lengths)),
                     )(sinks)
    assert np.all(np.isfinite(np.asarray(grads))) and np.all(np.asarray(grads)[0::2] == 0)


@pytest.mark.parametrize("sinks, error, match", [
    (np.zeros((N + 1,), np.float32), ValueError, r"sinks must have shape \[N\] = \(4,\).*got \(5,\)"),
    (np.zeros((1, N), np.float32), ValueError, r"sinks must have shape \[N\] = \(4,\).*got \(1, 4\)"),
    (np.zeros((N,), np.int32), TypeError, "sinks must be a float array; got int32"),
])
def test_sinks_argument_errors(rng, sinks, error, match):
    q, k, v = random_qkv(rng, B, T, S, N, K, H, "float32")
    with pytest.raises(error, match=match):
        jax_flash.attention(q, k, v, sinks=sinks)
