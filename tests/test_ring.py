"""Ring attention (jax_flash.ring_attention) against jax_flash.attention on the whole sequence.

conftest.py gives four host devices: rings of 1, 2 and 4 run here; the ring of 8
runs in a subprocess with eight.
"""

import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import jax_flash
from jax_flash import _registration
from helpers import assert_close, random_qkv
from jax_flash.ring import schedule, unzigzag, zigzag

SPEC = P(None, "sp")
CPU_DEVICES = jax.devices("cpu")
GPUS = jax.devices("gpu") if jax.default_backend() == "gpu" else []


@pytest.fixture(autouse=True)
def _on_the_cpu():
    """Every test but test_on_gpus runs on the host devices (float64 is CPU-only)."""
    with jax.default_device(CPU_DEVICES[0]):
        yield


def _shard_map():
    if hasattr(jax, "shard_map"):
        return jax.shard_map
    from jax.experimental.shard_map import shard_map

    return shard_map


def _mesh(ring, devices=CPU_DEVICES):
    return Mesh(np.array(devices[:ring]), ("sp",))


def _tracks_vma():
    """Whether this jax types the manual axes a value varies over (check_vma)."""
    from jax._src import config

    return hasattr(config, "_check_vma")


def _ring_fn(ring, segments=False, check_vma=True, devices=CPU_DEVICES, **kwargs):
    """Global arrays in, global (out, lse [B, T, N]) out, in the layout's order."""

    def local(q, k, v, *ids):
        q_ids, kv_ids = ids if ids else (None, None)
        return jax_flash.ring_attention(
            q, k, v, axis_name="sp", q_segment_ids=q_ids, kv_segment_ids=kv_ids,
            return_residual=True, **kwargs,
        )

    specs = (SPEC,) * (5 if segments else 3)
    extra = {"check_vma": check_vma} if hasattr(jax, "shard_map") else {"check_rep": check_vma}
    mesh = _mesh(ring, devices)
    return _shard_map()(local, mesh=mesh, in_specs=specs, out_specs=(SPEC, SPEC), **extra)


def _compare(rng, q, k, v, ring, *, layout="zigzag", ids=None, factor=1.0, devices=CPU_DEVICES,
             **kwargs):
    """out, lse and dq, dk, dv of the ring (global order restored) vs plain attention."""
    order = (lambda x: zigzag(x, ring)) if layout == "zigzag" else (lambda x: x)
    restore = (lambda x: unzigzag(x, ring)) if layout == "zigzag" else (lambda x: x)
    ring_fn = _ring_fn(ring, segments=ids is not None, layout=layout, devices=devices, **kwargs)
    seg = {} if ids is None else {"q_segment_ids": ids[0], "kv_segment_ids": ids[1]}
    ids_in = () if ids is None else tuple(order(i) for i in ids)

    def ring_global(q, k, v):
        out, lse = ring_fn(order(q), order(k), order(v), *ids_in)
        return restore(out), restore(lse)

    dout = jnp.asarray(rng.standard_normal(q.shape), q.dtype)
    out, lse = jax.jit(ring_global)(q, k, v)
    want_out, want_lse = jax_flash.attention(q, k, v, return_residual=True, **seg, **kwargs)
    assert_close("out", out, want_out, q.dtype, factor)
    assert_close("lse", lse, want_lse, q.dtype, factor)

    grads = jax.jit(jax.grad(lambda *a: jnp.sum(ring_global(*a)[0] * dout), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(
        lambda *a: jnp.sum(jax_flash.attention(*a, **seg, **kwargs) * dout), argnums=(0, 1, 2)
    )(q, k, v)
    for name, g, w in zip(("dq", "dk", "dv"), grads, want):
        assert_close(name, g, w, q.dtype, 2 * factor)


@pytest.mark.parametrize("ring", [2, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_matches_attention(rng, ring, layout, causal):
    q, k, v = random_qkv(rng, 2, 64, 64, 4, 2, 32, "float64")  # GQA: 4 query heads, 2 kv
    _compare(rng, q, k, v, ring, layout=layout, is_causal=causal)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_low_precision_causal_zigzag(rng, dtype):
    """Partial outputs come back in the input dtype and merge in float32."""
    q, k, v = random_qkv(rng, 1, 128, 128, 2, 2, 32, dtype)
    _compare(rng, q, k, v, 4, is_causal=True, scale=0.3)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_segments_cross_shards(rng, layout):
    """Packed documents of uneven lengths that straddle shard (and chunk) boundaries."""
    lengths = [[37, 5, 50, 36], [1, 90, 30, 7]]
    ids = jnp.asarray([np.repeat(np.arange(len(l)), l) for l in lengths], jnp.int32)  # [2, 128]
    q, k, v = random_qkv(rng, 2, 128, 128, 2, 1, 32, "float64")
    _compare(rng, q, k, v, 4, layout=layout, ids=(ids, ids), is_causal=True)


def test_segments_rows_that_see_nothing(rng):
    """Query ids absent from every key shard: zeros out, -inf lse, zero grads, no NaN."""
    ring, t = 4, 64
    q, k, v = random_qkv(rng, 1, t, t, 2, 2, 16, "float64")
    q_ids = jnp.asarray(np.where(np.arange(t) % 8 == 3, 7, 0)[None], jnp.int32)  # id 7: no key
    kv_ids = jnp.zeros((1, t), jnp.int32)
    ring_fn = _ring_fn(ring, segments=True, is_causal=True, layout="contiguous")
    out, lse = jax.jit(ring_fn)(q, k, v, q_ids, kv_ids)
    want_out, want_lse = jax_flash.attention(
        q, k, v, is_causal=True, q_segment_ids=q_ids, kv_segment_ids=kv_ids, return_residual=True
    )
    blind = np.asarray(q_ids[0] == 7)
    np.testing.assert_array_equal(np.asarray(out)[:, blind], 0.0)
    assert np.all(np.isneginf(np.asarray(lse)[:, blind]))
    assert_close("out", out, want_out, q.dtype)
    assert_close("lse", lse[:, ~blind], want_lse[:, ~blind], q.dtype)
    dq = jax.jit(jax.grad(lambda q: jnp.sum(ring_fn(q, k, v, q_ids, kv_ids)[0])))(q)
    assert np.all(np.isfinite(np.asarray(dq)))
    np.testing.assert_array_equal(np.asarray(dq)[:, blind], 0.0)


def test_soft_cap(rng):
    q, k, v = random_qkv(rng, 1, 64, 64, 2, 2, 32, "float64")
    q = q * 3  # logits large enough for the cap to matter
    _compare(rng, q, k, v, 2, is_causal=True, logits_soft_cap=5.0)


@pytest.mark.parametrize("ring", [2, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal,window", [(True, (20, 0)), (True, (5, 0)), (False, (9, 23)),
                                           (False, (40, 3)), (True, (100, 0))],
                         ids=["causal_20", "causal_5", "two_sided", "left_wider", "past_every_shard"])
def test_window_crosses_shards(rng, ring, layout, causal, window):
    """Windows smaller than a chunk, wider than a shard, two-sided and
    lopsided: the global window, whatever layout places the chunks."""
    q, k, v = random_qkv(rng, 2, 64, 64, 4, 2, 16, "float64")
    _compare(rng, q, k, v, ring, layout=layout, is_causal=causal, local_window_size=window)


def test_window_with_segments_and_soft_cap(rng):
    lengths = [[37, 5, 50, 36], [1, 90, 30, 7]]
    ids = jnp.asarray([np.repeat(np.arange(len(l)), l) for l in lengths], jnp.int32)
    q, k, v = random_qkv(rng, 2, 128, 128, 2, 1, 32, "float64")
    _compare(rng, 3 * q, k, v, 4, ids=(ids, ids), is_causal=True, local_window_size=(24, 0),
             logits_soft_cap=5.0)


def test_window_low_precision(rng):
    q, k, v = random_qkv(rng, 1, 128, 128, 2, 2, 32, "bfloat16")
    _compare(rng, q, k, v, 4, is_causal=True, local_window_size=(40, 0))


@pytest.mark.parametrize("check_vma", [True, False], ids=["vma", "unchecked"])
@pytest.mark.parametrize("layout,options", [
    ("zigzag", dict(is_causal=True)),
    ("contiguous", dict(is_causal=True)),
    ("zigzag", dict(is_causal=True, local_window_size=(20, 0))),
], ids=["zigzag", "contiguous", "zigzag-window"])
def test_sinks(rng, layout, options, check_vma):
    """Attention sinks around the ring: out, lse and dq, dk, dv, dsinks against
    jax_flash.attention's sinks on the whole sequence. The sinks enter
    shard_map replicated (one logit per head for the whole sequence), so
    their gradient must sum the rows of every device."""
    ring = 4
    q, k, v = random_qkv(rng, 2, 64, 64, 4, 2, 16, "float64")
    sinks = jnp.asarray(rng.standard_normal(4) + 2.0, jnp.float64)
    order = (lambda x: zigzag(x, ring)) if layout == "zigzag" else (lambda x: x)
    restore = (lambda x: unzigzag(x, ring)) if layout == "zigzag" else (lambda x: x)
    extra = {"check_vma": check_vma} if hasattr(jax, "shard_map") else {"check_rep": check_vma}
    f = _shard_map()(
        lambda q, k, v, s: jax_flash.ring_attention(q, k, v, axis_name="sp", layout=layout, sinks=s,
                                                    return_residual=True, **options),
        mesh=_mesh(ring), in_specs=(SPEC,) * 3 + (P(),), out_specs=(SPEC, SPEC), **extra,
    )

    def ring_global(q, k, v, s):
        out, lse = f(order(q), order(k), order(v), s)
        return restore(out), restore(lse)

    out, lse = jax.jit(ring_global)(q, k, v, sinks)
    want_out, want_lse = jax_flash.attention(q, k, v, sinks=sinks, return_residual=True, **options)
    assert_close("out", out, want_out, q.dtype)
    assert_close("lse", lse, want_lse, q.dtype)
    plain = jax_flash.attention(q, k, v, **options)
    assert not np.allclose(np.asarray(out), np.asarray(plain), atol=1e-3)  # the sinks take a real share
    dout = jnp.asarray(rng.standard_normal(q.shape), q.dtype)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(ring_global(*a)[0] * dout), argnums=(0, 1, 2, 3)))(
        q, k, v, sinks)
    want = jax.grad(lambda q, k, v, s: jnp.sum(jax_flash.attention(q, k, v, sinks=s, **options) * dout),
                    argnums=(0, 1, 2, 3))(q, k, v, sinks)
    for name, g, w in zip(("dq", "dk", "dv", "dsinks"), grads, want):
        assert_close(name, g, w, q.dtype, 2.0)


def test_ring_of_one_is_plain_attention(rng):
    q, k, v = random_qkv(rng, 2, 48, 48, 2, 2, 32, "float32")
    dout = jnp.asarray(rng.standard_normal(q.shape), q.dtype)
    for causal in (False, True):
        ring_fn = _ring_fn(1, is_causal=causal)
        out, lse = jax.jit(ring_fn)(q, k, v)
        want_out, want_lse = jax_flash.attention(q, k, v, is_causal=causal, return_residual=True)
        np.testing.assert_array_equal(out, want_out)
        np.testing.assert_array_equal(lse, want_lse)
        grads = jax.jit(jax.grad(lambda *a: jnp.sum(ring_fn(*a)[0] * dout), argnums=(0, 1, 2)))(q, k, v)
        want = jax.grad(
            lambda *a: jnp.sum(jax_flash.attention(*a, is_causal=causal) * dout), argnums=(0, 1, 2)
        )(q, k, v)
        for g, w in zip(grads, want):
            np.testing.assert_array_equal(g, w)


def test_unbatched_and_unchecked_vma(rng):
    """[T, N, H] inputs, and shard_map(check_vma=False)."""
    q, k, v = random_qkv(rng, 1, 32, 32, 2, 2, 16, "float64")
    q, k, v = q[0], k[0], v[0]
    spec = P("sp")
    kw = {"check_vma": False} if hasattr(jax, "shard_map") else {"check_rep": False}
    f = _shard_map()(
        lambda q, k, v: jax_flash.ring_attention(q, k, v, axis_name="sp", is_causal=True),
        mesh=_mesh(2), in_specs=(spec,) * 3, out_specs=spec, **kw,
    )
    out = unzigzag(jax.jit(f)(*(zigzag(x, 2, axis=0) for x in (q, k, v))), 2, axis=0)
    assert_close("out", out, jax_flash.attention(q, k, v, is_causal=True), q.dtype)


def test_batch_and_sequence_mesh(rng):
    """A 2 x 2 mesh: batch over "dp", the ring over "sp"; then a ring over both."""
    mesh = Mesh(np.array(CPU_DEVICES[:4]).reshape(2, 2), ("dp", "sp"))
    spec = P("dp", "sp")
    f = _shard_map()(
        lambda q, k, v: jax_flash.ring_attention(q, k, v, axis_name="sp", is_causal=True),
        mesh=mesh, in_specs=(spec,) * 3, out_specs=spec,
    )
    q, k, v = random_qkv(rng, 4, 32, 32, 2, 2, 16, "float64")
    out = unzigzag(jax.jit(f)(*(zigzag(x, 2) for x in (q, k, v))), 2)
    want = jax_flash.attention(q, k, v, is_causal=True)
    assert_close("out", out, want, q.dtype)
    # A ring over both axes (axis_name a tuple, 4 devices).
    spec = P(None, ("dp", "sp"))
    f = _shard_map()(
        lambda q, k, v: jax_flash.ring_attention(q, k, v, axis_name=("dp", "sp"), is_causal=True),
        mesh=mesh, in_specs=(spec,) * 3, out_specs=spec,
    )
    out = unzigzag(jax.jit(f)(*(zigzag(x, 4) for x in (q, k, v))), 4)
    assert_close("out (ring over both axes)", out, want, q.dtype)


@pytest.mark.skipif(len(GPUS) < 2, reason="needs two GPUs")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_on_gpus(rng, dtype, layout):
    """The GPU kernels around a ring of every GPU, against plain attention on one."""
    ring = min(len(GPUS), 8)
    with jax.default_device(GPUS[0]):
        q, k, v = random_qkv(rng, 2, 256 * ring, 256 * ring, 4, 2, 64, dtype)
        ids = jnp.asarray(np.repeat([0, 1, 2], [100, 256 * ring - 150, 50])[None].repeat(2, 0), jnp.int32)
        _compare(rng, q, k, v, ring, layout=layout, is_causal=True, devices=GPUS, ids=(ids, ids),
                 factor=2.0)


def test_ring_of_eight_in_subprocess(tmp_path):
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        jax.config.update("jax_enable_x64", True)
        from jax.sharding import Mesh, PartitionSpec as P
        import jax_flash
        from jax_flash.ring import zigzag, unzigzag
        sm = jax.shard_map if hasattr(jax, "shard_map") else __import__(
            "jax.experimental.shard_map", fromlist=["shard_map"]).shard_map
        mesh = Mesh(np.array(jax.devices()[:8]), ("sp",))
        rng = np.random.default_rng(8)
        q, k, v, do = (jnp.asarray(rng.standard_normal((1, 64, 2, 16))) for _ in range(4))
        ring = sm(lambda q, k, v: jax_flash.ring_attention(q, k, v, axis_name="sp", is_causal=True),
                  mesh=mesh, in_specs=(P(None, "sp"),) * 3, out_specs=P(None, "sp"))
        f = lambda q, k, v: unzigzag(ring(zigzag(q, 8), zigzag(k, 8), zigzag(v, 8)), 8)
        g = lambda q, k, v: jax_flash.attention(q, k, v, is_causal=True)
        errs = [float(jnp.abs(jax.jit(f)(q, k, v) - g(q, k, v)).max())]
        loss = lambda fn: (lambda *a: jnp.sum(fn(*a) * do))
        got = jax.jit(jax.grad(loss(f), argnums=(0, 1, 2)))(q, k, v)
        want = jax.grad(loss(g), argnums=(0, 1, 2))(q, k, v)
        errs += [float(jnp.abs(a - b).max()) for a, b in zip(got, want)]
        print("ERRS", max(errs))
        """
    )
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)  # not the source tree: the installed package
    assert run.returncode == 0, run.stderr[-3000:]
    err = float(re.search(r"ERRS (\S+)", run.stdout).group(1))
    assert err < 1e-12, err


# --- schedule and skipped steps ------------------------------------------------


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("ring", [1, 2, 3, 4, 5])
def test_schedule_covers_each_visible_block_once(ring, layout, causal):
    steps = schedule(ring, is_causal=causal, layout=layout)
    zig = causal and layout == "zigzag"
    chunks_of = (lambda d: (d, 2 * ring - 1 - d)) if zig else (lambda d: (d,))
    for d in range(ring):
        done = [(qc, kc, m) for step in steps[d] for qc, kc, m in step]
        assert len(done) == len(set(done))
        want = set()
        for s in range(ring):
            for qc in chunks_of(d):
                for kc in chunks_of((d - s) % ring):
                    if not causal or kc < qc:
                        want.add((qc, kc, "full"))
                    elif kc == qc:
                        want.add((qc, kc, "causal"))
        assert set(done) == want
    if zig:  # every device: the same work at every step (a diagonal pair counts half)
        work = lambda step: sum(0.5 if m == "causal" else 1.0 for *_, m in step)
        for s in range(ring):
            assert len({work(steps[d][s]) for d in range(ring)}) == 1
    if causal and layout == "contiguous":  # device d has work in d + 1 steps
        assert [sum(map(bool, row)) for row in steps] == list(range(1, ring + 1))


def _kernel_calls(text, target):
    """(operand shapes of q and k, is_causal) of every `target` custom call."""
    calls = []
    for line in text.splitlines():
        if f"custom_call @{target}(" in line:
            types = re.search(r":\s*\((tensor<[^>]*>), (tensor<[^>]*>)", line)
            causal = re.search(r"is_causal = (\d)", line).group(1) == "1"
            calls.append((types.group(1), types.group(2), causal))
    return calls


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_causal_steps_skip_empty_blocks(layout):
    """Zigzag: one causal call of the whole shard, then D - 1 calls of two
    half-by-half blocks (half a full step), no branches; contiguous: the D - 1
    later steps in a conditional (skipped where the visiting shard is later)."""
    ring, b, t = 4, 2, 64
    f = _shard_map()(
        lambda q, k, v: jax_flash.ring_attention(q, k, v, axis_name="sp", is_causal=True, layout=layout),
        mesh=_mesh(ring), in_specs=(SPEC,) * 3, out_specs=SPEC,
    )
    q, k = jnp.zeros((b, t, 4, 16), jnp.float32), jnp.zeros((b, t, 2, 16), jnp.float32)
    text = jax.jit(jax.grad(lambda *a: f(*a).sum(), argnums=(0, 1, 2))).lower(q, k, k).as_text()
    tl, c = t // ring, t // ring // 2
    for target in (_registration.FWD_TARGET, _registration.BWD_TARGET):
        calls = _kernel_calls(text, target)
        assert len(calls) == ring
        assert calls[0] == (f"tensor<{b}x{tl}x4x16xf32>", f"tensor<{b}x{tl}x2x16xf32>", True)
        if layout == "zigzag":
            step = (f"tensor<{2 * b}x{c}x4x16xf32>", f"tensor<{2 * b}x{c}x2x16xf32>", False)
        else:
            step = (f"tensor<{b}x{tl}x4x16xf32>", f"tensor<{b}x{tl}x2x16xf32>", False)
        assert calls[1:] == [step] * (ring - 1)
    branches = text.count("stablehlo.case") + text.count("stablehlo.if")
    assert branches == (0 if layout == "zigzag" else 2 * (ring - 1))


def test_zigzag_order_and_inverse():
    x = jnp.arange(16).reshape(1, 16)
    z = zigzag(x, 2)  # chunks of 4: device 0 gets chunks 0 and 3, device 1 chunks 1 and 2
    np.testing.assert_array_equal(z[0], [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11])
    np.testing.assert_array_equal(unzigzag(z, 2), x)
    y = jnp.arange(2 * 24 * 3).reshape(2, 24, 3)
    for ring in (1, 2, 3, 4, 6, 12):
        np.testing.assert_array_equal(unzigzag(zigzag(y, ring), ring), y)
        np.testing.assert_array_equal(zigzag(unzigzag(y, ring), ring), y)
    with pytest.raises(ValueError, match="multiple of 2 \\* axis_size = 10"):
        zigzag(y, 5)


# --- errors --------------------------------------------------------------------


def test_errors(rng):
    q, k, v = random_qkv(rng, 1, 32, 32, 2, 2, 16, "float32")
    run = lambda *specs, **kw: jax.jit(_shard_map()(
        lambda q, k, v: jax_flash.ring_attention(q, k, v, axis_name="sp", **kw),
        mesh=_mesh(2), in_specs=specs or (SPEC,) * 3, out_specs=SPEC,
    ))(q, k, v)

    with pytest.raises(ValueError, match="axis_name 'sp' is not a bound mesh axis"):
        jax.jit(lambda q: jax_flash.ring_attention(q, q, q, axis_name="sp"))(q)
    if _tracks_vma():  # older jax (no check_vma): the unsharded operand goes unnoticed
        with pytest.raises(ValueError, match="query is not sharded over the mesh axis 'sp'"):
            run(P(), SPEC, SPEC)
        with pytest.raises(ValueError, match="key is not sharded over the mesh axis 'sp'"):
            run(SPEC, P(), P())
    with pytest.raises(ValueError, match="local_window_size must be non-negative"):
        run(local_window_size=(-1, 0))
    with pytest.raises(ValueError, match="layout must be one of"):
        run(layout="striped")
    with pytest.raises(TypeError, match="is_causal must be a Python bool"):
        run(is_causal=1)
    with pytest.raises(ValueError, match="must be given together"):
        run(q_segment_ids=jnp.zeros((1, 16), jnp.int32))
    with pytest.raises(ValueError, match="implementation must be one of"):
        run(implementation="fast")
    q, k, v = q[:, :30], k[:, :30], v[:, :30]  # 15 positions a device: odd
    with pytest.raises(ValueError, match="layout='zigzag' needs an even local sequence length"):
        run(is_causal=True)
    q = q[:, :16]
    with pytest.raises(ValueError, match="is_causal=True needs equal query and key shards"):
        run(is_causal=True)
