"""jax_flash.paged_attention against the float64 reference and against the
contiguous attention kernels on the gathered cache, every element checked.

Random pools and tables: shuffled blocks, partial last blocks, sequences of
length 1 and of the whole table, sequences shorter than the new tokens.
On the CPU the native paged kernel runs; `paged_attention_by_gather` is the
CUDA path (gather, then jax_flash.attention) and the oracle here.
"""

import pathlib
import re

import jax
import jax.export  # older jax does not import the submodule with jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from helpers import CPU, ON_GPU, assert_close, to_f64_cpu
from jax_flash import reference
from jax_flash._paged_gather import paged_attention_by_gather
from jax_flash.paged import PagedConfig

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
H = 32


def random_pool(rng, batch, max_blocks, block_size, kv_heads, head_dim, dtype, spare=1):
    """A pool with `spare` blocks more than the tables use, and tables that
    take distinct blocks in a shuffled order (never 0..n in sequence)."""
    num_blocks = batch * max_blocks + spare
    shape = (num_blocks, block_size, kv_heads, head_dim)
    key_cache = jnp.asarray(rng.standard_normal(shape), dtype)
    value_cache = jnp.asarray(rng.standard_normal(shape), dtype)
    tables = rng.permutation(num_blocks)[: batch * max_blocks].reshape(batch, max_blocks)
    return key_cache, value_cache, jnp.asarray(tables, jnp.int32)


def ragged_lengths(rng, capacity, tq, block_size):
    """1, the whole table, a partial last block, and one shorter than Tq
    (its first queries sit at negative positions) where Tq > 1."""
    partial = int(rng.integers(1, capacity + 1))
    if block_size > 1 and partial % block_size == 0:
        partial -= 1 if partial > 1 else 0
    lengths = [1, capacity, max(partial, 1)]
    if tq > 1:
        lengths.append(max(1, tq // 2))
    return jnp.asarray(lengths, jnp.int32)


def check_lse(name, actual, expected, dtype, factor=1.0):
    """Rows that see no key have lse -inf in both; the others are compared."""
    actual = np.asarray(jnp.asarray(actual, jnp.float64))
    expected = np.asarray(expected, np.float64)
    empty = np.isneginf(expected)
    assert np.array_equal(np.isneginf(actual), empty), f"{name}: -inf rows differ"
    assert_close(name, np.where(empty, 0.0, actual), np.where(empty, 0.0, expected), dtype, factor)


def run_all(q, kc, vc, tables, lengths, **options):
    """(native out, lse), (gather out, lse), (float64 reference out, lse)."""
    native = jax.jit(lambda *a: jax_flash.paged_attention(*a, return_residual=True, **options))(
        q, kc, vc, tables, lengths)
    config = PagedConfig(
        scale=options.get("scale", 1 / np.sqrt(q.shape[-1])),
        softcap=options.get("logits_soft_cap") or 0.0,
        window_left=-1 if options.get("local_window_size") is None else options["local_window_size"],
    )
    gathered = jax.jit(lambda *a: paged_attention_by_gather(*a, config=config))(
        q, kc, vc, tables, lengths)
    ref = reference.paged_attention(to_f64_cpu(q), to_f64_cpu(kc), to_f64_cpu(vc),
                                    jax.device_put(tables, CPU), jax.device_put(lengths, CPU),
                                    return_residual=True, **options)
    return native, gathered, tuple(np.asarray(x) for x in ref)


def check_all(q, kc, vc, tables, lengths, dtype, **options):
    (out, lse), (g_out, g_lse), (r_out, r_lse) = run_all(q, kc, vc, tables, lengths, **options)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == q.shape[:-1] and lse.dtype == q.dtype
    assert_close("out vs float64 reference", out, r_out, dtype)
    check_lse("lse vs float64 reference", lse, r_lse, dtype)
    # Both sides carry their own rounding: twice the tolerance.
    assert_close("out vs gathered attention", out, np.asarray(g_out, np.float64), dtype, 2.0)
    check_lse("lse vs gathered attention", lse, np.asarray(g_lse, np.float64), dtype, 2.0)
    # Queries before the sequence's start see nothing: exact zeros.
    positions = np.asarray(lengths)[:, None] - q.shape[1] + np.arange(q.shape[1])
    assert np.all(np.asarray(out, np.float32)[positions < 0] == 0)
    return out


# (block_size, max_blocks): a capacity of 24 to 512 positions.
POOLS = [(1, 24), (16, 5), (256, 2)]


@pytest.mark.parametrize("heads", [(4, 2), (2, 2)], ids=lambda h: f"N{h[0]}K{h[1]}")
@pytest.mark.parametrize("tq", [1, 4, 16], ids=lambda t: f"Tq{t}")
@pytest.mark.parametrize("pool", POOLS, ids=lambda p: f"bs{p[0]}")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matches_reference_and_gathered_attention(rng, dtype, pool, tq, heads):
    block_size, max_blocks = pool
    n, k = heads
    kc, vc, tables = random_pool(rng, 4 if tq > 1 else 3, max_blocks, block_size, k, H, dtype)
    lengths = ragged_lengths(rng, max_blocks * block_size, tq, block_size)
    q = jnp.asarray(rng.standard_normal((lengths.shape[0], tq, n, H)), dtype)
    check_all(q, kc, vc, tables, lengths, dtype)


# Window sizes below and above the block size; a soft cap that bends the logits.
@pytest.mark.parametrize("options", [
    dict(logits_soft_cap=2.0),
    dict(local_window_size=5),
    dict(local_window_size=40, logits_soft_cap=3.0, scale=0.3),
    dict(local_window_size=0),
], ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("pool", POOLS[:2], ids=lambda p: f"bs{p[0]}")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_soft_cap_window_and_scale(rng, dtype, pool, options):
    block_size, max_blocks = pool
    kc, vc, tables = random_pool(rng, 4, max_blocks, block_size, 2, H, dtype)
    lengths = ragged_lengths(rng, max_blocks * block_size, 8, block_size)
    q = jnp.asarray(rng.standard_normal((4, 8, 4, H)), dtype)
    check_all(q, kc, vc, tables, lengths, dtype, **options)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_other_dtypes(rng, dtype):
    if ON_GPU and dtype == "float64":
        pytest.skip("float64 runs on the CPU only")
    kc, vc, tables = random_pool(rng, 3, 4, 16, 2, 24, dtype)  # head dim not a multiple of 16
    lengths = jnp.asarray([64, 17, 3], jnp.int32)
    q = jnp.asarray(rng.standard_normal((3, 5, 8, 24)), dtype)
    check_all(q, kc, vc, tables, lengths, dtype, logits_soft_cap=4.0)


def test_many_query_rows_per_tile(rng):
    """N / K * Tq = 80 packed rows: two row tiles per key head, the second
    starting mid-way through a head's tokens."""
    kc, vc, tables = random_pool(rng, 2, 3, 64, 1, H, "float32")
    lengths = jnp.asarray([192, 70], jnp.int32)
    q = jnp.asarray(rng.standard_normal((2, 20, 4, H)), jnp.float32)
    check_all(q, kc, vc, tables, lengths, "float32", local_window_size=30)


def test_decode_step_equals_contiguous_attention(rng):
    """Tq = 1 against jax_flash.attention on the cache gathered in position
    order, with nothing but key_value_seq_lengths (an independent oracle)."""
    block_size, max_blocks = 16, 6
    kc, vc, tables = random_pool(rng, 3, max_blocks, block_size, 2, H, "float32")
    lengths = jnp.asarray([96, 1, 41], jnp.int32)
    q = jnp.asarray(rng.standard_normal((3, 1, 4, H)), jnp.float32)
    j = np.arange(max_blocks * block_size)
    blocks = np.asarray(tables)[:, j // block_size]
    keys, values = kc[blocks, j % block_size], vc[blocks, j % block_size]
    want = jax_flash.attention(q, keys, values, key_value_seq_lengths=lengths)
    got = jax_flash.paged_attention(q, kc, vc, tables, lengths)
    assert_close("out", got, np.asarray(want, np.float64), "float32", 2.0)


@pytest.mark.parametrize("options", [{}, dict(local_window_size=5, logits_soft_cap=3.0)],
                         ids=["plain", "window-softcap"])
@pytest.mark.parametrize("pool", POOLS[:2], ids=lambda p: f"bs{p[0]}")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sinks_match_the_reference(rng, dtype, pool, options):
    """sinks (gpt-oss decoding): every query's softmax also counts one logit
    per query head, with no value; against the float64 reference with the
    sinks as an extra key column. A query that sees no key (the sequence
    shorter than Tq) returns zeros and the sink as its logsumexp."""
    block_size, max_blocks = pool
    kc, vc, tables = random_pool(rng, 4, max_blocks, block_size, 2, H, dtype)
    lengths = ragged_lengths(rng, max_blocks * block_size, 8, block_size)
    q = jnp.asarray(rng.standard_normal((4, 8, 4, H)), dtype)
    # Above the logits' typical range: each sink takes a real share of its rows.
    sinks = jnp.asarray(rng.standard_normal(4) + 2.0, jnp.float32)
    out, lse = jax.jit(lambda *a: jax_flash.paged_attention(*a, sinks=sinks, return_residual=True, **options))(
        q, kc, vc, tables, lengths)
    r_out, r_lse = reference.paged_attention(
        to_f64_cpu(q), to_f64_cpu(kc), to_f64_cpu(vc), jax.device_put(tables, CPU), jax.device_put(lengths, CPU),
        sinks=to_f64_cpu(sinks), return_residual=True, **options)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.dtype == q.dtype
    assert_close("out vs float64 reference", out, np.asarray(r_out), dtype)
    check_lse("lse vs float64 reference", lse, np.asarray(r_lse), dtype)
    assert np.all(np.isfinite(np.asarray(lse, np.float32)))  # every row has its sink
    positions = np.asarray(lengths)[:, None] - q.shape[1] + np.arange(q.shape[1])
    empty = positions < 0  # [B, Tq]: no key visible
    assert empty.any()
    assert np.all(np.asarray(out, np.float32)[empty] == 0)
    np.testing.assert_array_equal(np.asarray(lse)[empty],
                                  np.broadcast_to(np.asarray(sinks.astype(q.dtype)), np.asarray(lse)[empty].shape))
    plain = jax_flash.paged_attention(q, kc, vc, tables, lengths, **options)
    assert not np.allclose(np.asarray(out, np.float32), np.asarray(plain, np.float32), atol=1e-2)


def test_sinks_decode_step_equals_contiguous_attention(rng):
    """Tq = 1 with sinks against jax_flash.attention's sinks on the cache
    gathered in position order (the contiguous kernels as the oracle)."""
    block_size, max_blocks = 16, 6
    kc, vc, tables = random_pool(rng, 3, max_blocks, block_size, 2, H, "float32")
    lengths = jnp.asarray([96, 1, 41], jnp.int32)
    q = jnp.asarray(rng.standard_normal((3, 1, 4, H)), jnp.float32)
    sinks = jnp.asarray(rng.standard_normal(4) + 2.0, jnp.float32)
    j = np.arange(max_blocks * block_size)
    blocks = np.asarray(tables)[:, j // block_size]
    keys, values = kc[blocks, j % block_size], vc[blocks, j % block_size]
    want = jax_flash.attention(q, keys, values, key_value_seq_lengths=lengths, sinks=sinks)
    got = jax_flash.paged_attention(q, kc, vc, tables, lengths, sinks=sinks)
    assert_close("out", got, np.asarray(want, np.float64), "float32", 2.0)


def test_sinks_under_vmap(rng):
    """vmap over queries and tables sharing one pool and one set of sinks."""
    kc, vc, tables = random_pool(rng, 2, 3, 16, 2, H, "float32")
    qs = jnp.asarray(rng.standard_normal((3, 2, 4, 4, H)), jnp.float32)
    lens = jnp.asarray(rng.integers(1, 49, (3, 2)), jnp.int32)
    sinks = jnp.asarray(rng.standard_normal(4), jnp.float32)
    fn = jax.vmap(lambda q, l: jax_flash.paged_attention(q, kc, vc, tables, l, sinks=sinks))
    got = jax.jit(fn)(qs, lens)
    for i in range(3):
        want = jax_flash.paged_attention(qs[i], kc, vc, tables, lens[i], sinks=sinks)
        np.testing.assert_allclose(np.asarray(got[i]), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_out_of_range_ids_and_lengths_are_clamped(rng):
    """Block ids outside the pool read the nearest end of it, lengths beyond
    the table use the whole table, negative or zero lengths see nothing:
    exactly the result of the clamped arguments, and nothing crashes."""
    block_size, max_blocks = 16, 3
    kc, vc, tables = random_pool(rng, 4, max_blocks, block_size, 2, H, "float32")
    num_blocks = kc.shape[0]
    bad_tables = np.asarray(tables).copy()
    bad_tables[0, 1] = num_blocks + 7
    bad_tables[1, 0] = -3
    bad_tables[2, 2] = 2**31 - 1
    bad_lengths = np.asarray([40, 1000, -5, 0], np.int32)
    q = jnp.asarray(rng.standard_normal((4, 2, 4, H)), jnp.float32)
    out = jax_flash.paged_attention(q, kc, vc, jnp.asarray(bad_tables), jnp.asarray(bad_lengths))
    clamped = jax_flash.paged_attention(
        q, kc, vc, jnp.asarray(np.clip(bad_tables, 0, num_blocks - 1)),
        jnp.asarray(np.clip(bad_lengths, 0, max_blocks * block_size)))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(clamped))
    assert np.all(np.asarray(out)[2:] == 0)  # lengths -5 and 0: no key visible
    check_all(q, kc, vc, jnp.asarray(bad_tables), jnp.asarray(bad_lengths), "float32")


def test_entries_past_the_length_are_never_read(rng):
    """Table entries beyond a sequence's last block may hold anything (here:
    another sequence's blocks and garbage ids); the result does not change."""
    kc, vc, tables = random_pool(rng, 2, 4, 16, 2, H, "float32")
    lengths = jnp.asarray([20, 33], jnp.int32)  # 2 and 3 blocks of 4
    q = jnp.asarray(rng.standard_normal((2, 3, 4, H)), jnp.float32)
    other = np.asarray(tables).copy()
    other[0, 2:] = [-1, 10**6]
    other[1, 3] = other[0, 0]
    np.testing.assert_array_equal(
        np.asarray(jax_flash.paged_attention(q, kc, vc, tables, lengths)),
        np.asarray(jax_flash.paged_attention(q, kc, vc, jnp.asarray(other), lengths)))


def test_vmap_over_a_leading_axis(rng):
    """vmap over independent pools, and over queries sharing one pool."""
    kcs, vcs, tabs, lens, qs = [], [], [], [], []
    for _ in range(2):
        kc, vc, tables = random_pool(rng, 2, 3, 16, 2, H, "float32")
        kcs.append(kc), vcs.append(vc), tabs.append(tables)
        lens.append(jnp.asarray(rng.integers(1, 49, 2), jnp.int32))
        qs.append(jnp.asarray(rng.standard_normal((2, 4, 4, H)), jnp.float32))
    stack = lambda xs: jnp.stack(xs)  # noqa: E731
    fn = jax.jit(jax.vmap(jax_flash.paged_attention))
    got = fn(stack(qs), stack(kcs), stack(vcs), stack(tabs), stack(lens))
    for i in range(2):
        want = jax_flash.paged_attention(qs[i], kcs[i], vcs[i], tabs[i], lens[i])
        np.testing.assert_allclose(np.asarray(got[i]), np.asarray(want), rtol=1e-6, atol=1e-6)
    shared = jax.vmap(jax_flash.paged_attention, in_axes=(0, None, None, 0, 0))
    got = shared(stack(qs), kcs[0], vcs[0], stack([tabs[0]] * 2), stack(lens))
    for i in range(2):
        want = jax_flash.paged_attention(qs[i], kcs[0], vcs[0], tabs[0], lens[i])
        np.testing.assert_allclose(np.asarray(got[i]), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_grad_is_a_clear_error(rng):
    kc, vc, tables = random_pool(rng, 1, 2, 16, 2, H, "float32")
    q = jnp.asarray(rng.standard_normal((1, 1, 2, H)), jnp.float32)
    lengths = jnp.asarray([20], jnp.int32)
    loss = lambda q, kc: jax_flash.paged_attention(q, kc, vc, tables, lengths).sum()  # noqa: E731
    for argnums in (0, 1):
        with pytest.raises(TypeError, match="paged_attention is forward only"):
            jax.grad(loss, argnums)(q, kc)
    with pytest.raises(TypeError, match="paged_attention is forward only"):
        jax.jvp(lambda q: loss(q, kc), (q,), (q,))
    # Gradients that do not flow through the call are unaffected.
    assert jax.grad(lambda x: loss(q, kc) + x)(1.0) == 1.0


def _args(rng):
    kc, vc, tables = random_pool(rng, 2, 3, 16, 2, 16, "float32")
    q = jnp.asarray(rng.standard_normal((2, 1, 4, 16)), jnp.float32)
    return dict(query=q, key_cache=kc, value_cache=vc, block_tables=tables,
                key_value_seq_lengths=jnp.asarray([5, 40], jnp.int32))


BAD_ARGUMENTS = [
    (dict(query=lambda a: a[0]), ValueError, r"query must be \[B, Tq, N, H\]; got shape \(1, 4, 16\)"),
    (dict(key_cache=lambda a: a[0]), ValueError, r"key_cache must be \[num_blocks, block_size, K, H\]"),
    (dict(value_cache=lambda a: a[:, :8]), ValueError, r"value_cache shape \(7, 8, 2, 16\) must equal key_cache shape \(7, 16, 2, 16\)"),
    (dict(query=lambda a: a.astype(jnp.int32)), TypeError, "query dtype must be float16, bfloat16, float32 or float64; got int32"),
    (dict(key_cache=lambda a: a.astype(jnp.bfloat16)), TypeError, "key_cache dtype must equal query dtype float32; got bfloat16"),
    (dict(key_cache=lambda a: a[..., :8], value_cache=lambda a: a[..., :8]), ValueError, "key_cache head dim 8 must equal query head dim 16"),
    (dict(query=lambda a: a[:, :, :3]), ValueError, "key_cache has 2 heads; it must divide query's 3"),
    (dict(block_tables=lambda a: a.astype(jnp.int64)), TypeError, "block_tables must be int32; got int64"),
    (dict(block_tables=lambda a: a[0]), ValueError, r"block_tables must have shape \[B, max_blocks\] = \[2, >= 1\].*got \(3,\)"),
    (dict(block_tables=lambda a: a[:1]), ValueError, r"block_tables must have shape \[B, max_blocks\].*got \(1, 3\)"),
    (dict(key_value_seq_lengths=lambda a: a.astype(jnp.float32)), TypeError, "key_value_seq_lengths must be int32; got float32"),
    (dict(key_value_seq_lengths=lambda a: a[:, None]), ValueError, r"key_value_seq_lengths must have shape \(2,\).*got \(2, 1\)"),
]


@pytest.mark.parametrize("change,error,message", BAD_ARGUMENTS,
                         ids=[re.sub(r"\W+", "_", m[:40]) for _, _, m in BAD_ARGUMENTS])
def test_bad_arguments_raise_clear_errors(rng, change, error, message):
    args = _args(rng)
    for name, fn in change.items():
        args[name] = fn(args[name])
    with pytest.raises(error, match=message):
        jax.jit(lambda a: jax_flash.paged_attention(**a))(args)


@pytest.mark.parametrize("options,error,message", [
    (dict(sinks=jnp.zeros(3)), ValueError, r"sinks must have shape \[N\] = \(4,\), one logit per query head; got \(3,\)"),
    (dict(sinks=jnp.zeros(4, jnp.int32)), TypeError, "sinks must be a float array; got int32"),
    (dict(local_window_size=(4, 2)), ValueError, "causal: local_window_size's right side must be 0"),
    (dict(local_window_size=-1), ValueError, "local_window_size must be non-negative"),
    (dict(local_window_size="wide"), TypeError, "local_window_size must be an int or"),
    (dict(logits_soft_cap=-1.0), ValueError, "logits_soft_cap must be a positive finite number"),
    (dict(scale=float("nan")), ValueError, "scale must be finite"),
])
def test_bad_options_raise_clear_errors(rng, options, error, message):
    with pytest.raises(error, match=message):
        jax_flash.paged_attention(**_args(rng), **options)


def test_window_tuple_equals_int(rng):
    args = _args(rng)
    np.testing.assert_array_equal(
        np.asarray(jax_flash.paged_attention(**args, local_window_size=(3, 0))),
        np.asarray(jax_flash.paged_attention(**args, local_window_size=3)))


def test_export_round_trip(rng):
    pytest.importorskip("flatbuffers")  # Exported.serialize needs it (not a jax dependency)
    args = _args(rng)
    if ON_GPU:  # on CUDA float32 takes the gather fallback; the custom call is the 16-bit path
        args = {n: x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x for n, x in args.items()}
    fn = jax.jit(lambda a: jax_flash.paged_attention(**a))
    exp = jax.export.export(fn, disabled_checks=jax_flash.export_safety_checks())(args)
    assert "jax_flash_paged_fwd_v" in exp.mlir_module()
    again = jax.export.deserialize(exp.serialize())
    np.testing.assert_array_equal(np.asarray(again.call(args)), np.asarray(fn(args)))


def _readme_snippet():
    text = README.read_text()
    section = text[text.index("### Decoding with a paged cache"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_decode_step(rng):
    """The README's snippet, run on random pools: the new token lands at its
    position in its sequence's block, and the output equals attention over
    the sequence's keys in position order."""
    ns = {}
    exec(_readme_snippet(), ns)
    kc = jnp.asarray(rng.standard_normal(ns["key_cache"].shape), jnp.bfloat16)
    vc = jnp.asarray(rng.standard_normal(ns["value_cache"].shape), jnp.bfloat16)
    tables, lengths, block_size = ns["block_tables"], ns["lengths"], ns["block_size"]
    b, k, h = tables.shape[0], kc.shape[2], kc.shape[3]
    q = jnp.asarray(rng.standard_normal((b, 1, 2 * k, h)), jnp.bfloat16)
    k_new = jnp.asarray(rng.standard_normal((b, 1, k, h)), jnp.bfloat16)
    v_new = jnp.asarray(rng.standard_normal((b, 1, k, h)), jnp.bfloat16)
    out, kc2, vc2, lengths2 = ns["decode_step"](q, k_new, v_new, kc, vc, lengths)
    np.testing.assert_array_equal(np.asarray(lengths2), np.asarray(lengths) + 1)
    j = np.arange(tables.shape[1] * block_size)
    blocks = np.asarray(tables)[:, j // block_size]
    keys, values = kc2[blocks, j % block_size], vc2[blocks, j % block_size]
    for i in range(b):
        pos = int(lengths[i])
        np.testing.assert_array_equal(np.asarray(keys[i, pos]), np.asarray(k_new[i, 0]))
        np.testing.assert_array_equal(np.asarray(values[i, pos]), np.asarray(v_new[i, 0]))
    # Everything else in the pool is untouched.
    assert int(jnp.sum(kc2 != kc)) <= b * k * h
    want = reference.attention(to_f64_cpu(q), to_f64_cpu(keys), to_f64_cpu(values),
                               key_value_seq_lengths=jax.device_put(lengths2, CPU))
    assert_close("out", out, np.asarray(want), "bfloat16")


def test_two_platform_export_runs_on_the_cpu(rng):
    """An export for cpu and cuda carries both branches (the CPU kernel and
    the gather fallback's attention call) and runs here like the jitted call."""
    args = _args(rng)
    fn = jax.jit(lambda a: jax_flash.paged_attention(**a))
    exp = jax.export.export(fn, platforms=("cpu", "cuda"),
                            disabled_checks=jax_flash.export_safety_checks())(args)
    text = exp.mlir_module()
    assert "jax_flash_paged_fwd_v" in text and "jax_flash_fwd_v" in text
    np.testing.assert_array_equal(np.asarray(exp.call(args)), np.asarray(fn(args)))
