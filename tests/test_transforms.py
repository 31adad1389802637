"""jit, grad, vmap, pmap, shard_map and checkpoint compose with jax_flash."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from helpers import assert_close, random_qkv, reference_f64

DTYPE = "float32"


def _attn(q, k, v, causal=True):
    return jax_flash.attention(q, k, v, is_causal=causal)


def test_jitted_hlo_contains_custom_call(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16, DTYPE)
    hlo = jax.jit(_attn).lower(q, k, v).as_text()
    assert "jax_flash_fwd" in hlo
    grad_hlo = jax.jit(jax.grad(lambda q, k, v: _attn(q, k, v).sum())).lower(q, k, v).as_text()
    assert "jax_flash_fwd" in grad_hlo and "jax_flash_bwd" in grad_hlo


@pytest.mark.parametrize(
    "in_axes", [(0, 0, 0), (0, None, None), (None, 0, 0), (1, 1, 1)], ids=str
)
def test_vmap_matches_loop(rng, in_axes):
    q, k, v = random_qkv(rng, 2, 21, 21, 2, 2, 32, DTYPE)
    args = []
    for x, axis in zip((q, k, v), in_axes):
        if axis is None:
            args.append(x)
        else:  # stack 3 fresh variants along `axis`
            stacked = jnp.stack([x * (1 + 0.1 * i) for i in range(3)], axis=axis)
            args.append(stacked)
    got = jax.jit(jax.vmap(_attn, in_axes=in_axes))(*args)
    want = jnp.stack(
        [
            _attn(*(a if ax is None else jnp.take(a, i, axis=ax) for a, ax in zip(args, in_axes)))
            for i in range(3)
        ]
    )
    np.testing.assert_array_equal(got, want)


def test_nested_vmap(rng):
    q, k, v = random_qkv(rng, 6, 13, 17, 2, 1, 16, DTYPE)
    split = lambda x: x.reshape(2, 3, 1, *x.shape[1:])
    got = jax.vmap(jax.vmap(_attn))(split(q), split(k), split(v))
    want = _attn(q, k, v).reshape(got.shape)
    np.testing.assert_array_equal(got, want)


def test_vmap_of_grad(rng):
    q, k, v = random_qkv(rng, 3, 19, 19, 2, 2, 32, DTYPE)
    qs, ks, vs = (x[:, None] for x in (q, k, v))  # 3 independent single-batch problems
    grad_fn = jax.grad(lambda q, k, v: jnp.sum(_attn(q, k, v) ** 2), argnums=(0, 1, 2))
    got = jax.jit(jax.vmap(grad_fn))(qs, ks, vs)
    for i in range(3):
        want = grad_fn(qs[i], ks[i], vs[i])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g[i], w, rtol=1e-6, atol=1e-6)


def test_vmap_with_shared_kv_grad(rng):
    """in_axes (0, None, None): dk/dv sum over the mapped queries."""
    q, k, v = random_qkv(rng, 1, 16, 16, 2, 2, 32, DTYPE)
    qs = jnp.stack([q, q * 0.5])
    loss = lambda qs, k, v: jnp.sum(jax.vmap(_attn, in_axes=(0, None, None))(qs, k, v) ** 2)
    dk = jax.grad(loss, argnums=1)(qs, k, v)
    want = sum(jax.grad(lambda q, k: jnp.sum(_attn(q, k, v) ** 2), argnums=1)(x, k) for x in qs)
    np.testing.assert_allclose(dk, want, rtol=1e-5, atol=1e-6)


def test_pmap(rng):
    n = jax.local_device_count()
    q, k, v = random_qkv(rng, 2 * n, 33, 33, 2, 2, 32, DTYPE)
    per_device = lambda x: x.reshape(n, 2, *x.shape[1:])
    out = jax.pmap(_attn)(per_device(q), per_device(k), per_device(v))
    ref_out, _ = reference_f64(q, k, v, is_causal=True)
    assert_close("out", np.asarray(out).reshape(q.shape), ref_out, DTYPE)
    grads = jax.pmap(jax.grad(lambda q, k, v: jnp.sum(_attn(q, k, v) ** 2)))(
        per_device(q), per_device(k), per_device(v)
    )
    want = jax.grad(lambda q, k, v: jnp.sum(_attn(q, k, v) ** 2))(q, k, v)
    np.testing.assert_allclose(np.asarray(grads).reshape(q.shape), want, rtol=1e-5, atol=1e-6)


def _shard_map():
    if hasattr(jax, "shard_map"):
        return jax.shard_map
    from jax.experimental.shard_map import shard_map

    return shard_map


def test_shard_map_batch_sharding(rng):
    from jax.sharding import Mesh, PartitionSpec as P

    devices = np.array(jax.devices())
    mesh = Mesh(devices, ("batch",))
    q, k, v = random_qkv(rng, 2 * len(devices), 40, 40, 2, 2, 64, DTYPE)
    spec = P("batch")
    sharded = _shard_map()(_attn, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)

    def loss(q, k, v):
        return jnp.sum(sharded(q, k, v) ** 2)

    out = jax.jit(sharded)(q, k, v)
    ref_out, _ = reference_f64(q, k, v, is_causal=True)
    assert_close("out", out, ref_out, DTYPE)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(lambda q, k, v: jnp.sum(_attn(q, k, v) ** 2), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_checkpoint(rng):
    q, k, v = random_qkv(rng, 2, 29, 29, 2, 2, 32, DTYPE)

    def block(q, k, v):
        return jnp.tanh(_attn(q, k, v)) + q

    loss = lambda f: (lambda q, k, v: jnp.sum(f(q, k, v) ** 2))
    got = jax.jit(jax.grad(loss(jax.checkpoint(block)), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(loss(block), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_forward_mode_autodiff_is_a_clear_error(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16, DTYPE)
    with pytest.raises(TypeError, match="forward-mode"):
        jax.jvp(_attn, (q, k, v), (q, k, v))


def test_lse_carries_no_gradient(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16, DTYPE)
    g = jax.grad(lambda q: jnp.sum(jax_flash.attention(q, k, v, return_residual=True)[1]))(q)
    np.testing.assert_array_equal(g, jnp.zeros_like(q))
