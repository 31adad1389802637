"""jit over a mesh: jax_flash's calls run per shard (the rules of _partitioning.py).

Each case shards q, k, v (and the optional operands) with NamedShardings,
runs the forward and jax.grad under jax.jit, and checks: results equal the
unsharded call (each shard runs the same kernel on the same data, so float32
agrees to 1e-6), results come out sharded like the inputs, and the compiled
HLO has no collective where the rules can split (a broadcast bias's gradient
is summed across shards: its all-reduce is the one allowed), and a visible
all-gather where they cannot (sequence sharding, K not divisible by the mesh
axis, unshared dropout).
"""

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_flash
from jax_flash import _compat

pytestmark = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")

AxisType = getattr(jax.sharding, "AxisType", None)
COLLECTIVE = re.compile(
    r"= (\S+) (all-gather|all-reduce|all-to-all|reduce-scatter|collective-permute)(?:-start)?\("
)


def collectives(hlo):
    """(op, result shape) of every collective in compiled HLO text."""
    return [(m.group(2), m.group(1).split("{")[0]) for m in COLLECTIVE.finditer(hlo)]


COLLECTIVE_ANY = re.compile(
    r"= (\([^)]*\)|\S+) (all-gather|all-reduce|all-to-all|reduce-scatter|collective-permute)"
    r"(?:-start)?\("
)


def collectives_all(hlo):
    """The same, with combined (tuple-shaped) collectives given per element:
    XLA versions differ in how many of them they combine."""
    out = []
    for m in COLLECTIVE_ANY.finditer(hlo):
        for shape in m.group(1).strip("()").split(", "):
            out.append((m.group(2), shape.split("{")[0].strip()))
    return out


@contextlib.contextmanager
def partitioner(name):
    """Shardy (jax's default) or GSPMD, for the duration."""
    if name == "gspmd" and not hasattr(jax.config, "jax_use_shardy_partitioner"):
        pytest.skip("this jax has no GSPMD switch")
    if name == "shardy" and not _compat.SHARDY_RULES:
        pytest.skip("this jax's custom_partitioning takes no shape-dependent Shardy rules "
                    "(need_replication_factors): under Shardy the calls run whole")
    old = getattr(jax.config, "jax_use_shardy_partitioner", True)
    jax.config.update("jax_use_shardy_partitioner", name == "shardy")
    try:
        yield
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


def make_mesh(shape, names, axis_type="auto"):
    devices = np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape)
    if AxisType is None:
        if axis_type != "auto":
            pytest.skip("this jax has no explicit sharding")
        return jax.sharding.Mesh(devices, names)
    kind = AxisType.Explicit if axis_type == "explicit" else AxisType.Auto
    return jax.sharding.Mesh(devices, names, axis_types=(kind,) * len(names))


# name: mesh shape, axis names, (B, T, S, N, K, H), q spec, k spec (None: q's),
# extra operands {argument: (maker(rng, B, T, S, N), spec)}, attention kwargs,
# whether the rules split (False: a visible reshard, any collective).
B, T, N, H = 4, 64, 4, 32


def _bias(shape):
    return lambda rng, b, t, s, n: jnp.asarray(
        rng.standard_normal(tuple(b if d == "B" else n if d == "N" else t if d == "T" else s
                                  if d == "S" else 1 for d in shape)), jnp.float32)


def _key_padding_mask(rng, b, t, s, n):
    return jnp.asarray(rng.random((b, 1, 1, s)) > 0.3).at[:, :, :, 0].set(True)


def _kv_lengths(rng, b, t, s, n):
    return jnp.asarray(rng.integers(1, s + 1, (b,)), jnp.int32)


def _segments(rng, b, t, s, n):
    return jnp.asarray(np.sort(rng.integers(0, 3, (b, t)), axis=1), jnp.int32)


def _sinks(rng, b, t, s, n):
    return jnp.asarray(rng.standard_normal(n) + 2.0, jnp.float32)


CASES = {
    "batch": ((4,), ("b",), (B, T, T, N, N, H), P("b"), None, {}, dict(is_causal=True), True),
    "heads": ((4,), ("n",), (B, T, T, N, N, H), P(None, None, "n"), None, {}, {}, True),
    "batch_heads": (
        (2, 2), ("b", "n"), (B, T, 48, N, N, H), P("b", None, "n"), None, {},
        dict(is_causal=True, logits_soft_cap=5.0, local_window_size=(16, 8)), True,
    ),
    "gqa_2_head_shards": (
        (2, 2), ("b", "n"), (B, T, T, 8, 4, H), P("b", None, "n"), None, {}, dict(is_causal=True),
        True,
    ),
    "gqa_4_head_shards": ((4,), ("n",), (B, T, T, 8, 4, H), P(None, None, "n"), None, {}, {}, True),
    "gqa_uneven": (  # K = 2 key heads over 4 head shards: gathered
        (4,), ("n",), (B, T, T, 8, 2, H), P(None, None, "n"), P(), {}, {}, False,
    ),
    "bias_like_q": (
        (2, 2), ("b", "n"), (B, T, T, N, N, H), P("b", None, "n"), None,
        {"bias": (_bias("BNTS"), P("b", "n"))}, {}, True,
    ),
    "bias_broadcast_batch": (  # [1, N, T, S]: replicated over "b", its gradient summed
        (2, 2), ("b", "n"), (B, T, T, N, N, H), P("b", None, "n"), None,
        {"bias": (_bias("1NTS"), P(None, "n"))}, {}, True,
    ),
    "bias_broadcast_heads": (  # [B, 1, T, S]: replicated over "n", its gradient summed
        (2, 2), ("b", "n"), (B, T, T, N, N, H), P("b", None, "n"), None,
        {"bias": (_bias("B1TS"), P("b"))}, {}, True,
    ),
    "key_padding_mask": (
        (4,), ("b",), (B, T, T, N, N, H), P("b"), None,
        {"mask": (_key_padding_mask, P("b"))}, {}, True,
    ),
    "kv_lengths": (
        (2, 2), ("b", "n"), (B, T, T, N, N, H), P("b", None, "n"), None,
        {"key_value_seq_lengths": (_kv_lengths, P("b"))}, dict(is_causal=True), True,
    ),
    "segments": (
        (2, 2), ("b", "n"), (B, T, T, N, N, H), P("b", None, "n"), None,
        {"q_segment_ids": (_segments, P("b")), "kv_segment_ids": (_segments, P("b"))},
        dict(is_causal=True), True,
    ),
    "sinks_heads": (  # attention sinks [N], split with the heads (forward epilogues)
        (4,), ("n",), (B, T, T, N, N, H), P(None, None, "n"), None,
        {"sinks": (_sinks, P("n"))}, dict(is_causal=True), True,
    ),
    "sinks_batch_heads": (  # replicated over "b"
        (2, 2), ("b", "n"), (B, T, T, N, N, H), P("b", None, "n"), None,
        {"sinks": (_sinks, P("n"))}, {}, True,
    ),
    "query_sequence": ((4,), ("t",), (B, T, T, N, N, H), P(None, "t"), P(), {}, {}, False),
    "key_sequence": ((4,), ("t",), (B, T, T, N, N, H), P(), P(None, "t"), {}, {}, False),
    "head_dim": ((4,), ("x",), (B, T, T, N, N, H), P(None, None, None, "x"), None, {}, {}, False),
    "dropout": (  # bits keyed by the global (batch, head): not split
        (4,), ("b",), (B, T, T, N, N, H), P("b"), None, {},
        dict(dropout_rate=0.25, dropout_rng=3), False,
    ),
    "dropout_shared": (
        (2, 2), ("b", "n"), (B, T, T, N, N, H), P("b", None, "n"), None, {},
        dict(dropout_rate=0.25, dropout_rng=3, dropout_broadcast=True), True,
    ),
}


def check_case(rng, name, axis_type="auto"):
    mesh_shape, names, (b, t, s, n, k, h), q_spec, k_spec, extra, kwargs, splits = CASES[name]
    mesh = make_mesh(mesh_shape, names, axis_type)
    k_spec = q_spec if k_spec is None else k_spec
    if "dropout_rng" in kwargs:
        kwargs = dict(kwargs, dropout_rng=jax.random.key(kwargs["dropout_rng"]))
    q = jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.float32)
    kv = [jnp.asarray(rng.standard_normal((b, s, k, h)), jnp.float32) for _ in range(2)]
    dout = jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.float32)
    if "q_segment_ids" in extra:  # one id sequence for queries and keys (T == S)
        ids = _segments(rng, b, t, s, n)
        made = {name: ids for name in extra}
    else:
        made = {name: maker(rng, b, t, s, n) for name, (maker, _) in extra.items()}
    names_extra = list(extra)

    def attn(q, k, v, *ops):
        return jax_flash.attention(q, k, v, **dict(zip(names_extra, ops)), **kwargs)

    diff = [0, 1, 2] + [3 + i for i, e in enumerate(names_extra) if e == "bias"]

    def grads(q, k, v, dout, *ops):
        loss = lambda *a: jnp.sum(attn(*a) * dout)  # noqa: E731
        return jax.grad(loss, argnums=tuple(diff))(q, k, v, *ops)

    args = [q, *kv, dout] + [made[e] for e in names_extra]
    specs = [q_spec, k_spec, k_spec, q_spec] + [extra[e][1] for e in names_extra]
    sharded = [jax.device_put(a, NamedSharding(mesh, sp)) for a, sp in zip(args, specs)]
    want_out = jax.jit(attn)(*args[:3], *args[4:])
    want_grads = jax.jit(grads)(*args)

    fwd = jax.jit(attn)
    out = fwd(*sharded[:3], *sharded[4:])
    np.testing.assert_allclose(out, want_out, rtol=1e-6, atol=1e-6)
    bwd = jax.jit(grads)
    got_grads = bwd(*sharded)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)

    fwd_collectives = collectives(fwd.lower(*sharded[:3], *sharded[4:]).compile().as_text())
    bwd_collectives = collectives(bwd.lower(*sharded).compile().as_text())
    if not splits:
        # Gathered onto every device, in the open: the HLO shows it.
        assert any(op == "all-gather" for op, _ in fwd_collectives), fwd_collectives
        return
    assert fwd_collectives == [], fwd_collectives
    allowed = set()
    if "bias" in extra:
        # The gradient of a bias broadcast along a split dim (batch, heads) is
        # summed over that dim's shards: one all-reduce of the bias's shard.
        bias, bias_spec = made["bias"], tuple(extra["bias"][1]) + (None,) * 4
        broadcast = [d == 1 and q_spec_dim is not None
                     for d, q_spec_dim in zip(bias.shape[:2], (q_spec + (None,) * 4)[::2])]
        if any(broadcast):
            local = [d // (mesh.shape[a] if a else 1) for d, a in zip(bias.shape, bias_spec)]
            allowed.add(("all-reduce", "f32[%s]" % ",".join(map(str, local))))
    assert set(bwd_collectives) <= allowed, bwd_collectives
    assert len(bwd_collectives) <= len(allowed)

    # Results are sharded like the inputs they follow.
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, q_spec), out.ndim), out.sharding
    grad_specs = [q_spec, k_spec, k_spec] + ([extra["bias"][1]] if len(diff) > 3 else [])
    for g, sp in zip(got_grads, grad_specs):
        assert g.sharding.is_equivalent_to(NamedSharding(mesh, sp), g.ndim), (sp, g.sharding)


@pytest.mark.parametrize("name", list(CASES))
def test_shardy(rng, name):
    with partitioner("shardy"):
        check_case(rng, name)


@pytest.mark.parametrize(
    "name", ["batch_heads", "gqa_2_head_shards", "gqa_uneven", "bias_broadcast_batch",
             "segments", "query_sequence", "dropout"]
)
def test_gspmd(rng, name):
    with partitioner("gspmd"):
        check_case(rng, name)


@pytest.mark.parametrize("mode", ["shardy", "gspmd"])
@pytest.mark.parametrize(
    "name", ["batch_heads", "gqa_uneven", "bias_broadcast_batch", "query_sequence", "dropout"]
)
def test_explicit_sharding(rng, mode, name):
    with partitioner(mode):
        check_case(rng, name, axis_type="explicit")


def test_explicit_sharding_segments(rng):
    with partitioner("shardy"):
        check_case(rng, "segments", axis_type="explicit")


def test_vmap_inside_sharded_jit(rng):
    """vmap's leading dim is one more batch dim: split like the others."""
    mesh = make_mesh((2, 2), ("v", "b"))
    q, k, v = (jnp.asarray(rng.standard_normal((2, B, T, N, H)), jnp.float32) for _ in range(3))
    attn = jax.vmap(lambda q, k, v: jax_flash.attention(q, k, v, is_causal=True))
    grad = jax.grad(lambda q, k, v: jnp.sum(attn(q, k, v) ** 2), argnums=(0, 1, 2))
    sharded = [jax.device_put(x, NamedSharding(mesh, P("v", "b"))) for x in (q, k, v)]
    for fn in (attn, grad):
        jitted = jax.jit(fn)
        for g, w in zip(jax.tree.leaves(jitted(*sharded)), jax.tree.leaves(jax.jit(fn)(q, k, v))):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
        assert collectives(jitted.lower(*sharded).compile().as_text()) == []


@pytest.mark.parametrize("mode", ["shardy", "gspmd"])
def test_sharding_propagates_through_projections(rng, mode):
    """A Megatron-style block: q, k, v come out of projections sharded by
    propagation (batch from x, heads from the weights), the attention runs on
    the local shards, and the only collective is the output projection's sum."""
    b, t, d, n, k, h = 4, 64, 64, 8, 4, 16
    mesh = make_mesh((2, 2), ("b", "n"))
    x = jnp.asarray(rng.standard_normal((b, t, d)), jnp.float32)
    wq, wk, wv = (jnp.asarray(rng.standard_normal((d, m * h)) * 0.1, jnp.float32)
                  for m in (n, k, k))
    wo = jnp.asarray(rng.standard_normal((n * h, d)) * 0.1, jnp.float32)

    def block(x, wq, wk, wv, wo):
        q = (x @ wq).reshape(b, t, n, h)
        kk, vv = ((x @ w).reshape(b, t, k, h) for w in (wk, wv))
        return jax_flash.attention(q, kk, vv, is_causal=True).reshape(b, t, n * h) @ wo

    specs = (P("b"), P(None, "n"), P(None, "n"), P(None, "n"), P("n", None))
    args = (x, wq, wk, wv, wo)
    sharded = [jax.device_put(a, NamedSharding(mesh, sp)) for a, sp in zip(args, specs)]
    grad = jax.grad(lambda *a: jnp.sum(block(*a) ** 2), argnums=(0, 1, 2, 3, 4))
    with partitioner(mode):
        for fn in (block, grad):
            jitted = jax.jit(fn)
            got, want = jitted(*sharded), jax.jit(fn)(*args)
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
            hlo = jitted.lower(*sharded).compile().as_text()
            # All-reduces only: the output projection's partial sums (and in the
            # gradient those of the inputs' and the weights' gradients).
            want = {("all-reduce", f"f32[{b // 2},{t},{d}]")}
            if fn is grad:
                want |= {("all-reduce", f"f32[{n * h // 2},{d}]"),
                         ("all-reduce", f"f32[{k * h // 2},{d}]")}
            assert set(collectives_all(hlo)) == want, collectives_all(hlo)
            calls = [line for line in hlo.splitlines() if "custom-call(" in line]
            assert calls and all(f"f32[{b // 2},{t},{n // 2},{h}]" in c for c in calls), calls


def _shard_map():
    if hasattr(jax, "shard_map"):
        return jax.shard_map
    from jax.experimental.shard_map import shard_map

    return shard_map


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_direct_calls_inside_shard_map(rng, jit):
    """_forward_call/_backward_call run on the shards shard_map hands them
    (as ring attention uses them): the rules step aside."""
    from jax_flash import _kernel_call as kc

    mesh = make_mesh((4,), ("x",))
    q, k, v, dout = (jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.float32) for _ in range(4))
    static = kc.KernelConfig(scale=H**-0.5, is_causal=True, implementation=0, features=0,
                             window_left=-1, window_right=-1, softcap=0.0, dropout_rate=0.0)
    features = [jnp.zeros((1, 1, 1, 1), jnp.float32), jnp.ones((1, 1, 1, 1), jnp.bool_),
                jnp.zeros((1,), jnp.int32), jnp.zeros((1,), jnp.int32)]
    features += [jnp.zeros((1, 1), jnp.int32)] * 4 + [jnp.zeros((1,), jnp.uint32), jnp.zeros((1,), jnp.int32)]

    def body(q, k, v, dout):
        out, lse = kc._forward_call(q, k, v, features, static)
        return (out, lse) + tuple(kc._backward_call(q, k, v, out, lse, dout, features, static))

    spec = P("x")
    # out, lse, dq, dk, dv and the backward's delta
    mapped = _shard_map()(body, mesh=mesh, in_specs=(spec,) * 4, out_specs=(spec,) * 6)
    if jit:
        mapped = jax.jit(mapped)
    got = mapped(*(jax.device_put(x, NamedSharding(mesh, spec)) for x in (q, k, v, dout)))
    for g, w in zip(got, body(q, k, v, dout)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
