"""Flax (nnx, linen) and Equinox adapters against each library's own attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest


flax = pytest.importorskip("flax")
from flax import linen, nnx  # noqa: E402

import jax_flash.flax  # noqa: E402

@pytest.fixture(autouse=True)
def _full_precision_matmuls():
    """The libraries' own attention is the reference: no TF32 matmuls on GPUs."""
    with jax.default_matmul_precision("highest"):
        yield


def _inputs(shape=(2, 12, 32), seed=1):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)  # conftest enables x64


def _padding_mask(batch, length):
    valid = jnp.arange(length)[None, :] < jnp.array([length, length - 4])[:batch, None]
    return nnx.make_attention_mask(valid, valid)


@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding"])
def test_nnx_multihead_attention(mask_kind):
    x = _inputs()
    mask = {"none": None, "causal": nnx.make_causal_mask(jnp.ones((2, 12))),
            "padding": _padding_mask(2, 12)}[mask_kind]
    make = lambda fn: nnx.MultiHeadAttention(num_heads=4, in_features=32, decode=False,
                                             rngs=nnx.Rngs(0), attention_fn=fn)
    ours, theirs = make(jax_flash.flax.attention_fn), make(nnx.dot_product_attention)
    # Padded query rows see no key: zeros here, an average in flax. Compare
    # (and differentiate) the rows with at least one visible key.
    rows = jnp.ones((2, 12, 1)) if mask is None else mask.any(-1)[:, 0, :, None]
    np.testing.assert_allclose(ours(x, mask=mask) * rows, theirs(x, mask=mask) * rows,
                               rtol=2e-5, atol=2e-5)

    def loss(model):
        return jnp.sum((model(x, mask=mask) * rows) ** 2)

    g_ours = nnx.grad(loss)(ours)
    g_theirs = nnx.grad(loss)(theirs)
    # nnx.grad gives a State (older flax) or a module-like graph (newer flax).
    as_state = lambda g: g if isinstance(g, nnx.State) else nnx.state(g)  # noqa: E731
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=5e-5),
                 as_state(g_ours), as_state(g_theirs))
    hlo = jax.jit(lambda x: nnx.merge(*nnx.split(ours))(x, mask=mask)).lower(x).as_text()
    assert "jax_flash_fwd" in hlo


def test_nnx_decode_cache_matches():
    """Token-by-token decoding with the KV cache (masks over cache slots)."""
    length = 8
    x = _inputs((1, length, 32))
    make = lambda fn: nnx.MultiHeadAttention(num_heads=4, in_features=32, decode=True,
                                             rngs=nnx.Rngs(0), attention_fn=fn)
    outs = []
    for fn in (jax_flash.flax.attention_fn, nnx.dot_product_attention):
        model = make(fn)
        model.init_cache((1, length, 32))
        outs.append(jnp.concatenate([model(x[:, i : i + 1]) for i in range(length)], axis=1))
    np.testing.assert_allclose(outs[0], outs[1], rtol=2e-5, atol=2e-5)


def test_linen_multihead_attention():
    x = _inputs()
    mask = nnx.make_causal_mask(jnp.ones((2, 12)))
    ours = linen.MultiHeadDotProductAttention(num_heads=4, attention_fn=jax_flash.flax.attention_fn)
    theirs = linen.MultiHeadDotProductAttention(num_heads=4)
    params = theirs.init(jax.random.key(0), x)
    np.testing.assert_allclose(ours.apply(params, x, mask=mask), theirs.apply(params, x, mask=mask),
                               rtol=2e-5, atol=2e-5)
    grad = lambda m: jax.grad(lambda p: jnp.sum(m.apply(p, x, mask=mask) ** 2))(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=5e-5),
                 grad(ours), grad(theirs))


def test_flax_adapter_bf16_checkpoint_jit():
    x = _inputs().astype(jnp.bfloat16)
    model = nnx.MultiHeadAttention(num_heads=4, in_features=32, decode=False, dtype=jnp.bfloat16,
                                   param_dtype=jnp.float32, rngs=nnx.Rngs(0),
                                   attention_fn=jax_flash.flax.attention_fn)

    @nnx.jit
    def loss_and_grad(model, x):
        f = jax.checkpoint(lambda x: model(x))
        return jax.value_and_grad(lambda x: jnp.sum(f(x).astype(jnp.float32) ** 2))(x)

    value, g = loss_and_grad(model, x)
    assert np.isfinite(float(value)) and g.dtype == jnp.bfloat16 and np.all(np.isfinite(g))


def test_flax_broadcast_dropout_shares_the_mask():
    x = jnp.broadcast_to(_inputs((1, 12, 32)), (2, 12, 32))  # two identical batch entries
    q = x.reshape(2, 12, 4, 8)
    run = lambda broadcast: jax_flash.flax.attention_fn(
        q, q, q, dropout_rng=jax.random.key(0), dropout_rate=0.5, broadcast_dropout=broadcast)
    shared, per_entry = run(True), run(False)
    np.testing.assert_array_equal(shared[0], shared[1])
    assert not np.allclose(per_entry[0], per_entry[1])
    np.testing.assert_array_equal(
        jax_flash.flax.attention_fn(q, q, q, dropout_rate=0.5, deterministic=True),
        jax_flash.attention(q, q, q))


def test_flax_adapter_rejects_sowing():
    q = _inputs((1, 4, 2, 8))
    with pytest.raises(NotImplementedError, match="cannot sow attention weights"):
        jax_flash.flax.attention_fn(q, q, q, module=object())


# --- Equinox ----------------------------------------------------------------

eqx = pytest.importorskip("equinox")
import jax_flash.equinox  # noqa: E402


def _eqx_pair(**kwargs):
    key = jax.random.key(0)
    kwargs.setdefault("dtype", jnp.float32)  # conftest enables x64; GPUs take no float64
    return (jax_flash.equinox.MultiheadAttention(4, 32, key=key, **kwargs),
            eqx.nn.MultiheadAttention(4, 32, key=key, **kwargs))


def test_equinox_same_weights_and_fields():
    ours, theirs = _eqx_pair(use_query_bias=True, qk_size=12, vo_size=6, output_size=20)
    assert isinstance(ours, eqx.nn.MultiheadAttention)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_array_equal(a, b)
    assert ours.qk_size == theirs.qk_size == 12 and ours.output_size == 20


@pytest.mark.parametrize("mask_kind", ["none", "causal", "per_head"])
def test_equinox_matches_under_vmap(mask_kind):
    ours, theirs = _eqx_pair()
    x = _inputs((3, 10, 32))
    mask = {"none": None, "causal": jnp.tril(jnp.ones((10, 10), bool)),
            "per_head": jax.random.bernoulli(jax.random.key(5), 0.7, (4, 10, 10)) | jnp.eye(10, dtype=bool)}[mask_kind]
    call = lambda m: jax.vmap(lambda x: m(x, x, x, mask))(x)
    loss = lambda m: jnp.sum(call(m) ** 2)
    np.testing.assert_allclose(call(ours), call(theirs), rtol=2e-5, atol=2e-5)
    g_ours, g_theirs = eqx.filter_grad(loss)(ours), eqx.filter_grad(loss)(theirs)
    for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=5e-5)


def test_equinox_causal_flag_and_dropout():
    ours, theirs = _eqx_pair(dropout_p=0.3)
    x = _inputs((10, 32))
    causal = jnp.tril(jnp.ones((10, 10), bool))
    np.testing.assert_allclose(ours(x, x, x, is_causal=True, inference=True),
                               theirs(x, x, x, causal, inference=True), rtol=2e-5, atol=2e-5)
    with pytest.raises(RuntimeError, match="dropout needs a `key`"):
        ours(x, x, x)
    a = ours(x, x, x, key=jax.random.key(1))
    np.testing.assert_array_equal(a, ours(x, x, x, key=jax.random.key(1)))
    assert not np.allclose(a, ours(x, x, x, inference=True))


def test_equinox_sinks_under_vmap_with_their_gradient():
    """sinks passed at call time, shared over a vmapped batch: the module's
    projections around the float64 reference with the sinks as an extra key
    column, and d loss / d sinks (summed over the batch) against the
    reference's through jax.grad."""
    from jax_flash import reference

    ours, _ = _eqx_pair()
    x = _inputs((3, 10, 32))
    sinks = jnp.asarray([1.0, -0.5, 2.0, 0.3], jnp.float32)

    def heads(proj, x):
        return jax.vmap(proj)(x).reshape(x.shape[0], 4, -1)

    def want(x, s):  # one sequence: [10, 32] -> [10, 32]
        q, k, v = (heads(p, x).astype(jnp.float64) for p in (ours.query_proj, ours.key_proj, ours.value_proj))
        o = reference.attention(q[None], k[None], v[None], is_causal=True, sinks=s.astype(jnp.float64))[0]
        return jax.vmap(ours.output_proj)(o.reshape(10, -1).astype(jnp.float32))

    call = lambda s: jax.vmap(lambda x: ours(x, x, x, is_causal=True, sinks=s))(x)  # noqa: E731
    np.testing.assert_allclose(call(sinks), jax.vmap(lambda x: want(x, sinks))(x), rtol=2e-5, atol=2e-5)
    assert not np.allclose(call(sinks), call(None), atol=1e-3)
    g = jax.grad(lambda s: jnp.sum(call(s) ** 2))(sinks)
    g_want = jax.grad(lambda s: jnp.sum(jax.vmap(lambda x: want(x, s))(x) ** 2))(sinks)
    np.testing.assert_allclose(g, g_want, rtol=1e-4, atol=5e-5)


def test_flax_adapter_several_batch_dims():
    """[batch1, batch2, T, N, H] with a mask broadcast over the second batch dim."""
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 3, 9, 2, 8), jnp.float32) for i in range(3))
    mask = jax.random.bernoulli(jax.random.key(7), 0.8, (2, 1, 1, 9, 9)) | jnp.eye(9, dtype=bool)
    bias = jax.random.normal(jax.random.key(8), (2, 3, 2, 9, 9), jnp.float32)
    # flax's own path needs the mask broadcast over every batch dim; ours does not.
    full_mask = jnp.broadcast_to(mask, (2, 3, 1, 9, 9))
    np.testing.assert_allclose(jax_flash.flax.attention_fn(q, k, v, bias, mask),
                               nnx.dot_product_attention(q, k, v, bias, full_mask), rtol=2e-5, atol=2e-5)
