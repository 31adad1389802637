"""Bias, masks, sequence lengths, segment ids, window, soft cap, dropout, GQA:
each and combined, forward and gradients (dbias included) against the float64
reference. On a GPU each case also runs through the generic kernels and with
deterministic=True (the generic backward), besides the default (tensor-core
kernels for 16-bit inputs)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash import reference
from helpers import GRAD_FACTOR, ON_GPU, ON_HOPPER, assert_close, random_qkv, to_f64_cpu


B, T, S, N, K, H = 2, 45, 70, 4, 2, 32


def _features(name, rng):
    """Keyword arguments (and the bias) for one named feature combination."""
    seg = lambda n: jnp.asarray(np.sort(rng.integers(0, 3, (B, n)), axis=1), jnp.int32)
    bias = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
    cases = {
        "bias_full": dict(bias=bias(B, N, T, S)),
        "bias_shared_over_batch": dict(bias=bias(1, N, T, S)),
        "bias_key_padding": dict(bias=bias(B, 1, 1, S)),
        "bias_2d": dict(bias=bias(T, S)),
        "mask_key_padding": dict(mask=jnp.asarray(rng.random((B, 1, 1, S)) > 0.3)),
        "mask_full": dict(mask=jnp.asarray(rng.random((B, N, T, S)) > 0.5)),
        "seq_lengths": dict(query_seq_lengths=jnp.array([T, 30], jnp.int32),
                            key_value_seq_lengths=jnp.array([20, S], jnp.int32)),
        "segments": dict(q_segment_ids=seg(T), kv_segment_ids=seg(S)),
        "window": dict(local_window_size=(7, 3)),
        "window_int_causal": dict(local_window_size=5, is_causal=True),
        "soft_cap": dict(logits_soft_cap=2.0),
        "everything": dict(bias=bias(1, N, T, S), mask=jnp.asarray(rng.random((B, 1, 1, S)) > 0.1),
                           is_causal=True, q_segment_ids=seg(T), kv_segment_ids=seg(S),
                           local_window_size=(20, 0), logits_soft_cap=3.0,
                           key_value_seq_lengths=jnp.array([S, 50], jnp.int32)),
    }
    return cases[name]


def _split(kwargs):
    """(bias, our kwargs, reference kwargs)."""
    kwargs = dict(kwargs)
    bias = kwargs.pop("bias", None)
    ref = dict(kwargs)
    if "logits_soft_cap" in ref:
        ref["logits_soft_cap"] = float(ref["logits_soft_cap"])
    return bias, kwargs, ref


CASES = ["bias_full", "bias_shared_over_batch", "bias_key_padding", "bias_2d", "mask_key_padding",
         "mask_full", "seq_lengths", "segments", "window", "window_int_causal", "soft_cap",
         "everything"]


# Kernel choices the feature tests run through: (implementation, deterministic).
MODES = [(None, False), ("generic", False), (None, True)] if ON_GPU else [(None, False)]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"{m[0] or 'auto'}{'-det' if m[1] else ''}")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("case", CASES)
def test_feature_forward_and_gradients(rng, case, dtype, mode):
    if ON_GPU and dtype == "float64":
        pytest.skip("float64 runs on the CPU only")
    q, k, v = random_qkv(rng, B, T, S, N, K, H, dtype)
    bias, ours, ref_kwargs = _split(_features(case, rng))
    ours.update(implementation=mode[0], deterministic=mode[1])
    dout = jnp.asarray(rng.standard_normal(q.shape), dtype)
    acc = jnp.promote_types(dtype, jnp.float32)
    if bias is not None:
        bias = bias.astype(acc)  # a float32 bias would round a float64 dbias

    out, res = jax_flash.attention(q, k, v, bias, return_residual=True, **ours)
    ref_out, ref_lse = reference.attention(
        to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v),
        None if bias is None else to_f64_cpu(bias), return_residual=True, **ref_kwargs)
    assert_close("out", out, ref_out, dtype)
    visible = np.isfinite(np.asarray(ref_lse))  # rows that see at least one key
    got_lse = np.swapaxes(np.asarray(res, np.float64), -1, -2)
    assert np.all(np.isneginf(got_lse[~visible])), "rows that see no key must report lse = -inf"
    assert_close("lse", np.where(visible, got_lse, 0), np.where(visible, ref_lse, 0), dtype)

    def loss(fn, q, k, v, b, **kw):
        return jnp.sum(fn(q, k, v, b, **kw).astype(acc) * dout.astype(acc))

    argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
    grads = jax.grad(lambda *a: loss(jax_flash.attention, *a, **ours), argnums)(q, k, v, bias)
    ref_grads = jax.grad(lambda *a: jnp.sum(
        reference.attention(*a, **ref_kwargs) * to_f64_cpu(dout)), argnums)(
        to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), None if bias is None else to_f64_cpu(bias))
    for name, g, r in zip(("dq", "dk", "dv", "dbias"), grads, ref_grads):
        assert_close(name, g, r, dtype, factor=GRAD_FACTOR)
    if bias is not None:
        assert grads[3].shape == bias.shape and grads[3].dtype == bias.dtype


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dropout_matches_reference_mask(rng, dtype):
    q, k, v = random_qkv(rng, B, T, S, N, K, H, dtype)
    key = jax.random.key(int(rng.integers(1 << 30)))
    rate = 0.25
    factor = reference.dropout_factor(jax.random.bits(key, (2,), jnp.uint32), B, N, T, S, rate)
    assert abs((factor > 0).mean() - (1 - rate)) < 0.02
    dout = jnp.asarray(rng.standard_normal(q.shape), dtype)
    acc = jnp.promote_types(dtype, jnp.float32)
    f = lambda q, k, v: jnp.sum(jax_flash.attention(
        q, k, v, is_causal=True, dropout_rate=rate, dropout_rng=key).astype(acc) * dout.astype(acc))
    g = lambda q, k, v: jnp.sum(reference.attention(
        q, k, v, is_causal=True, dropout_factor=to_f64_cpu(factor)) * to_f64_cpu(dout))
    out = jax_flash.attention(q, k, v, is_causal=True, dropout_rate=rate, dropout_rng=key)
    ref = reference.attention(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), is_causal=True,
                              dropout_factor=to_f64_cpu(factor))
    assert_close("out", out, ref, dtype)
    grads = jax.grad(f, (0, 1, 2))(q, k, v)
    ref_grads = jax.grad(g, (0, 1, 2))(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v))
    for name, a, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(name, a, r, dtype, factor=GRAD_FACTOR)


# Kernel families the many-block dropout test forces (None: the default;
# on the H200 the sm90 kernels: kPlainDropout where dropout is the call's
# only feature, causal or not ("64-causal", "128", "128-causal", "64"), kMasksDropout beside
# the masks' features (the other cases)).
DROPOUT_IMPLS = ([None, "sm80"] + (["sm90"] if ON_HOPPER else [])) if ON_GPU else [None]


@pytest.mark.parametrize("impl", DROPOUT_IMPLS, ids=lambda i: i or "auto")
@pytest.mark.parametrize("head_dim,dtype,extra", [
    (64, "bfloat16", dict(is_causal=True)),
    (128, "float16", dict()),
    (128, "bfloat16", dict(is_causal=True, local_window_size=(150, 0), segments=True)),
    (64, "float16", dict(broadcast=True, key_value_seq_lengths=True)),
    (128, "bfloat16", dict(is_causal=True, key_padding=True)),
    (128, "bfloat16", dict(is_causal=True)),
    (64, "bfloat16", dict()),
    (256, "bfloat16", dict(is_causal=True, local_window_size=(150, 0), segments=True)),
    (256, "float16", dict(broadcast=True)),
    (256, "bfloat16", dict(is_causal=True)),
], ids=["64-causal", "128", "128-window-segments", "64-broadcast-lengths", "128-key-padding", "128-causal", "64",
        "256-window-segments", "256-broadcast", "256-causal"])
def test_dropout_over_many_blocks(rng, impl, head_dim, dtype, extra):
    """Dropout where each tile sees several key blocks and each key block
    several query steps (T=300, S=520: tails in both), GQA 4:2, with the
    masks' features beside it, against the reference's own dropout factors
    (every element of out, lse and the three gradients). At 256 the sm90
    backward's kMasksDropout (by query halves) after the sm90 forward's
    kPlainDropout or kMasksDropout on 64-key blocks."""
    b, t, s, n, kh = 2, 300, 520, 4, 2
    q, k, v = random_qkv(rng, b, t, s, n, kh, head_dim, dtype)
    extra = dict(extra)
    shared = extra.pop("broadcast", False)
    if extra.pop("segments", False):
        # Packed documents of random lengths (contiguous ids), queries and keys alike.
        q_ids = np.sort(rng.integers(0, 4, (b, t)), axis=1).astype(np.int32)
        kv_ids = np.sort(rng.integers(0, 4, (b, s)), axis=1).astype(np.int32)
        extra.update(q_segment_ids=jnp.asarray(q_ids), kv_segment_ids=jnp.asarray(kv_ids))
    if extra.pop("key_value_seq_lengths", False):
        extra["key_value_seq_lengths"] = jnp.array([s, 333], jnp.int32)
    if extra.pop("key_padding", False):
        extra["mask"] = jnp.asarray(_key_padding(rng, b, 1, s))
    key = jax.random.key(int(rng.integers(1 << 30)))
    rate = 0.2
    words = np.asarray(jax.random.bits(key, (2,), jnp.uint32))
    factor = to_f64_cpu(reference.dropout_factor(words, b, n, t, s, rate, shared))
    ours = dict(extra, dropout_rate=rate, dropout_rng=key, dropout_broadcast=shared, implementation=impl)
    _check_against_reference(rng, q, k, v, ours, dict(extra, dropout_factor=factor), dtype)


@pytest.mark.parametrize("impl", DROPOUT_IMPLS, ids=lambda i: i or "auto")
@pytest.mark.parametrize("head_dim,dtype,extra", [
    (64, "bfloat16", dict(is_causal=True)),
    (128, "float16", dict()),
    (128, "bfloat16", dict(is_causal=True)),
    (64, "float16", dict()),
    (128, "bfloat16", dict(is_causal=True, sinks=True)),
    (64, "float16", dict(is_causal=True, key_value_seq_lengths=True)),
    (128, "bfloat16", dict(local_window_size=(150, 40))),
    (256, "float16", dict()),
    (256, "bfloat16", dict(is_causal=True, local_window_size=(150, 0), sinks=True)),
    (192, "bfloat16", dict(is_causal=True, key_value_seq_lengths=True)),
], ids=["64-causal", "128", "128-causal", "64", "128-causal-sinks", "64-causal-lengths", "128-window", "256",
        "256-causal-window-sinks", "192-causal-lengths"])
def test_soft_cap_over_many_blocks(rng, impl, head_dim, dtype, extra):
    """The soft cap where each tile sees several key blocks and each key
    block several query steps (T=300, S=520: tails in both), GQA 4:2, alone
    (on the H200 the sm90 kernels' kPlainSoftcap: the plain kernel's loop,
    causal or not) and beside the masks' features (kSoftcap forward,
    kMasksSoftcap backward; at 256 kSoftcap / kPlainSoftcap forward and
    kMasksSoftcap backward, by query halves),
    logits of a few caps so that the tanh bends: every element of out, lse
    and the three gradients against float64."""
    b, t, s, n, kh = 2, 300, 520, 4, 2
    q, k, v = random_qkv(rng, b, t, s, n, kh, head_dim, dtype)
    q = (q.astype(jnp.float32) * 3.0).astype(dtype)  # scaled logits up to ~10: past the cap of 4
    extra = dict(extra)
    if extra.pop("key_value_seq_lengths", False):
        extra["key_value_seq_lengths"] = jnp.array([s, 333], jnp.int32)
    if extra.pop("sinks", False):  # the epilogue's sink term beside the plain loop's soft cap
        extra["sinks"] = jnp.asarray(rng.standard_normal(n), jnp.float32)
    ours = dict(extra, logits_soft_cap=4.0, implementation=impl)
    _check_against_reference(rng, q, k, v, ours, dict(extra, logits_soft_cap=4.0), dtype)


def _check_against_reference(rng, q, k, v, ours, ref, dtype):
    """jax_flash.attention(**ours) against reference.attention(**ref) in
    float64: every element of out, of lse (-inf exactly where a row sees no
    key) and of dq, dk, dv under a random cotangent."""
    out, lse = jax_flash.attention(q, k, v, return_residual=True, **ours)
    ref_out, ref_lse = reference.attention(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), return_residual=True, **ref)
    assert_close("out", out, ref_out, dtype)
    visible = np.isfinite(np.asarray(ref_lse))
    got_lse = np.swapaxes(np.asarray(lse, np.float64), -1, -2)
    assert np.all(np.isneginf(got_lse[~visible]))
    assert_close("lse", np.where(visible, got_lse, 0), np.where(visible, ref_lse, 0), dtype)
    dout = jnp.asarray(rng.standard_normal(q.shape), dtype)
    grads = jax.grad(lambda *a: jnp.sum(jax_flash.attention(*a, **ours).astype(jnp.float32) * dout),
                     (0, 1, 2))(q, k, v)
    ref_grads = jax.grad(lambda *a: jnp.sum(reference.attention(*a, **ref) * to_f64_cpu(dout)), (0, 1, 2))(
        to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v))
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(name, g, r, dtype, factor=GRAD_FACTOR)


def _key_padding(rng, b, n, s):
    """A [b, n, 1, s] key-only boolean mask (s > 500): random keys hidden, one
    128-key block of each row hidden whole, the next visible, a tail from
    key 500 hidden in every row (a last 128-key block with nothing visible:
    the sm90 forward trims it, the backward's tile has no steps), from key
    400 in the even heads (a block hidden for one query head of a GQA group
    and not the other), and the first 128 keys in the last head."""
    mask = rng.random((b, n, 1, s)) > 0.3
    mask[..., 128:256] = False
    mask[..., 256:384] = True
    mask[..., 500:] = False
    mask[:, ::2, :, 400:] = False
    if n > 1:
        mask[:, -1, :, :128] = False
    return mask


@pytest.mark.parametrize("impl", DROPOUT_IMPLS, ids=lambda i: i or "auto")
@pytest.mark.parametrize("head_dim,dtype,extra", [
    (64, "bfloat16", dict(is_causal=True)),
    (128, "float16", dict(logits_soft_cap=5.0)),
    (128, "bfloat16", dict(q_segment_ids=True, local_window_size=(200, 50))),
    (256, "bfloat16", dict(q_segment_ids=True, local_window_size=(200, 50))),
    (256, "float16", dict(is_causal=True)),
], ids=["64-causal", "128-softcap", "128-segments-window", "256-segments-window", "256-causal"])
def test_key_padding_mask_over_many_blocks(rng, impl, head_dim, dtype, extra):
    """A key-only boolean mask ([B, N, 1, S]: a different padding per head)
    over several key blocks and query steps, GQA 4:2, beside the other
    masks and the soft cap (on the H200 the sm90 backward's feature
    variants read it per key; at 256 its 64-key tiles keep their steps and
    the bits hide the keys; the sm90 forward's 64-key blocks read 2 key
    bytes a lane), every element of out, lse and the gradients."""
    b, t, s, n, kh = 2, 300, 520, 4, 2
    q, k, v = random_qkv(rng, b, t, s, n, kh, head_dim, dtype)
    extra = dict(extra, mask=jnp.asarray(_key_padding(rng, b, n, s)), implementation=impl)
    if extra.pop("q_segment_ids", False):
        extra["q_segment_ids"] = jnp.asarray(np.sort(rng.integers(0, 3, (b, t)), axis=1), jnp.int32)
        extra["kv_segment_ids"] = jnp.asarray(np.sort(rng.integers(0, 3, (b, s)), axis=1), jnp.int32)
    ref = {name: x for name, x in extra.items() if name != "implementation"}
    _check_against_reference(rng, q, k, v, extra, ref, dtype)


def _dense_mask(rng, b, n, t, s, prefix=False, blocks=False):
    """A [b, n, t, s] boolean mask that differs per query: random pairs,
    32 x 32 patches hidden or visible whole, every query row keeping a
    visible key (the diagonal). prefix: a prefix-LM instead (query i sees
    keys j < max(i + 1, 100), a few random holes), whose blocks above the
    diagonal are hidden whole (the CPU path skips them). blocks: patches of
    96 queries x 80 keys hidden, visible or random, shifted per head, so
    that the block summary's 64 x 64 entries (mask_block_summary) take all
    three kinds, in the middle of a tile's keys too, and the heads of a GQA
    group differ."""
    i, j = np.arange(t)[:, None], np.arange(s)[None, :]
    if prefix:
        mask = (j < np.maximum(i + 1, 100)) & (rng.random((b, n, t, s)) > 0.05)
    elif blocks:
        head = np.arange(n)[:, None, None]
        patch = (i // 96 + j // 80 + head) % 3
        mask = np.where(patch == 0, False, np.where(patch == 1, True, rng.random((b, n, t, s)) > 0.5))
    else:
        mask = rng.random((b, n, t, s)) > 0.3
        patch = (i // 32 + j // 32) % 3
        mask = np.where(patch == 1, False, np.where(patch == 2, True, mask))
    mask[..., np.arange(t), np.minimum(np.arange(t), s - 1)] = True
    return mask


@pytest.mark.parametrize("impl", DROPOUT_IMPLS, ids=lambda i: i or "auto")
@pytest.mark.parametrize("head_dim,dtype,extra", [
    (64, "bfloat16", dict(is_causal=True)),
    (128, "float16", dict(q_segment_ids=True, local_window_size=(200, 50))),
    (128, "bfloat16", dict(dropout_rate=0.2)),
    (64, "float16", dict(prefix=True)),
    (64, "bfloat16", dict(blocks=True)),
    (128, "bfloat16", dict(blocks=True, is_causal=True, broadcast_heads=True)),
    (128, "float16", dict(prefix=True, broadcast_heads=True, kv_lengths=True)),
    (128, "bfloat16", dict(blocks=True, logits_soft_cap=20.0)),
    (64, "bfloat16", dict(prefix=True, broadcast_batch=True)),
    (128, "float16", dict(blocks=True, small=True)),
    (128, "float16", dict(prefix=True, logits_soft_cap=10.0, is_causal=False)),
    (64, "bfloat16", dict(blocks=True, logits_soft_cap=20.0)),
    (256, "bfloat16", dict(blocks=True, is_causal=True)),
    (256, "float16", dict(prefix=True, broadcast_heads=True, kv_lengths=True)),
], ids=["64-causal", "128-segments-window", "128-dropout", "64-prefix-lm", "64-blocks", "128-blocks-causal-[B,1,T,S]",
        "128-prefix-lm-[B,1,T,S]-lengths", "128-blocks-softcap", "64-prefix-lm-[1,N,T,S]", "128-blocks-40x70",
        "128-prefix-lm-softcap", "64-blocks-softcap", "256-blocks-causal", "256-prefix-lm-[B,1,T,S]-lengths"])
def test_dense_mask_over_many_blocks(rng, impl, head_dim, dtype, extra):
    """A per-query boolean mask ([B, N, T, S], or [B, 1, T, S]) over several
    key blocks and query steps, GQA 4:2, beside the other masks or dropout:
    every element of out, lse and the gradients against the float64
    reference. On the GPU the kernels take its block summary too
    (mask_block_summary), whose hidden and visible entries the patterns
    make. With the soft cap the H200's sm90 backward reads the mask at
    128 (kMasksSoftcap), the sm80 one at 64."""
    if impl == "sm90" and "dropout_rate" in extra:
        pytest.skip("the sm90 forward takes no per-query mask beside dropout (its refusal is tested below)")
    b, t, s, n, kh = 2, 300, 520, 4, 2
    if extra.pop("small", False):  # one block summary entry down each side, both tails
        t, s = 40, 70
    q, k, v = random_qkv(rng, b, t, s, n, kh, head_dim, dtype)
    extra = dict(extra, implementation=impl)
    mask = _dense_mask(rng, b, n, t, s, prefix=extra.pop("prefix", False), blocks=extra.pop("blocks", False))
    if extra.pop("broadcast_heads", False):
        mask = mask[:, :1]
    if extra.pop("broadcast_batch", False):
        mask = mask[:1]
    extra["mask"] = jnp.asarray(mask)
    if extra.pop("kv_lengths", False):
        extra["key_value_seq_lengths"] = jnp.asarray([s, 333], jnp.int32)
    factor = None
    if extra.get("dropout_rate"):
        key = jax.random.key(int(rng.integers(1 << 30)))
        extra["dropout_rng"] = key
        words = np.asarray(jax.random.bits(key, (2,), jnp.uint32))
        factor = to_f64_cpu(reference.dropout_factor(words, b, n, t, s, extra["dropout_rate"]))
    if extra.pop("q_segment_ids", False):
        extra["q_segment_ids"] = jnp.asarray(np.sort(rng.integers(0, 3, (b, t)), axis=1), jnp.int32)
        extra["kv_segment_ids"] = jnp.asarray(np.sort(rng.integers(0, 3, (b, s)), axis=1), jnp.int32)
    ref = {name: x for name, x in extra.items() if name not in ("implementation", "dropout_rate", "dropout_rng")}
    if factor is not None:
        ref["dropout_factor"] = factor
    _check_against_reference(rng, q, k, v, extra, ref, dtype)


@pytest.mark.parametrize("shape", [(1, 1, 64, 64), (2, 3, 130, 257), (1, 2, 1, 70), (3, 1, 200, 5)])
def test_mask_block_summary(rng, shape):
    """mask_block_summary against its definition: per 64 x 64 entry (the
    tails clipped to T and S), bit 0 where a pair is visible, bit 1 where
    all are (hidden, visible and mixed entries, tails in T and S)."""
    from jax_flash._kernel_call import mask_block_summary

    *lead, t, s = shape
    i, j = np.arange(t)[:, None], np.arange(s)[None, :]
    patch = (i // 100 + j // 130) % 3
    mask = np.where(patch == 0, False, np.where(patch == 1, True, rng.random(shape) > 0.5))
    got = np.asarray(jax.jit(mask_block_summary)(jnp.asarray(mask)))
    if shape == (2, 3, 130, 257):
        assert {0, 1, 3} <= set(np.unique(got).tolist())  # hidden, mixed and visible entries
    rows, cols = -(-t // 64), -(-s // 64)
    assert got.shape == (*lead, rows, cols) and got.dtype == np.uint8
    want = np.zeros_like(got)
    for r in range(rows):
        for c in range(cols):
            block = mask[..., 64 * r:64 * r + 64, 64 * c:64 * c + 64]
            want[..., r, c] = block.any(axis=(-2, -1)) | (block.all(axis=(-2, -1)).astype(np.uint8) << 1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("entries", ["right", "too few rows", "int32"])
def test_mask_blocks_operand_is_checked_by_the_handlers(rng, monkeypatch, entries):
    """The handlers' decoding of the mask_blocks operand (ffi/common/
    feature_decode.h DecodeMaskBlocks), on this platform: the GPU branch
    passes it, so here every call is given one the way the GPU branch would.
    A right one changes nothing (the CPU kernels do not read it); a wrong
    shape or dtype is a clear error naming it, in the forward and the
    backward."""
    from jax_flash import _kernel_call as kc

    def gpu_like(q, k, feature_ops, static, on_gpu):
        if not kc._takes_mask_blocks(q, k, feature_ops, static):
            return jnp.zeros((1,), jnp.uint8), static.features
        blocks = kc.mask_block_summary(feature_ops[1])
        if entries == "too few rows":
            blocks = blocks[..., :-1, :]
        elif entries == "int32":
            blocks = blocks.astype(jnp.int32)
        return blocks, static.features | kc.HAS_MASK_BLOCKS

    q, k, v = random_qkv(rng, 2, 130, 100, 2, 1, 16, "float32")
    mask = jnp.asarray(_dense_mask(rng, 2, 2, 130, 100, prefix=True))
    want = jax_flash.attention(q, k, v, mask=mask)
    want_dq = jax.grad(lambda q: jnp.sum(jax_flash.attention(q, k, v, mask=mask)))(q)
    monkeypatch.setattr(kc, "_mask_blocks", gpu_like)
    jax.clear_caches()  # (the calls above were traced with the CPU's placeholder)
    run = lambda: (jax_flash.attention(q, k, v, mask=mask),  # noqa: E731
                   jax.grad(lambda q: jnp.sum(jax_flash.attention(q, k, v, mask=mask)))(q))
    try:
        if entries == "right":
            got, got_dq = run()
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(got_dq, want_dq)
        else:
            with pytest.raises(Exception, match="mask_blocks .* must be uint8"):
                jax.block_until_ready(run())
    finally:  # no trace with these operands may serve a later test
        monkeypatch.undo()
        jax.clear_caches()


@pytest.mark.skipif(not ON_HOPPER, reason="the sm90 forward's refusal needs a 9.x GPU")
@pytest.mark.parametrize("extra", [dict(dropout_rate=0.1)], ids=["dropout"])
def test_sm90_forward_refuses_a_per_query_mask_beside(rng, extra):
    """The sm90 forward takes a key-only mask beside dropout, not one that
    differs per query: forced, that is a clear error. (Beside the soft cap
    it takes either: kMasksSoftcap reads it as kMasksBoolean does.)"""
    q, k, v = random_qkv(rng, 1, 64, 64, 2, 2, 64, "bfloat16")
    mask = jnp.asarray(rng.random((1, 2, 64, 64)) > 0.3)
    if "dropout_rate" in extra:
        extra = dict(extra, dropout_rng=jax.random.key(0))
    with pytest.raises(Exception, match="implementation='sm90' needs"):
        jax.block_until_ready(jax_flash.attention(q, k, v, mask=mask, implementation="sm90", **extra))


def test_dropout_is_a_function_of_the_key(rng):
    q, k, v = random_qkv(rng, 1, 33, 33, 2, 2, 16, "float32")
    run = lambda key, rate=0.5: jax_flash.attention(q, k, v, dropout_rate=rate, dropout_rng=key)
    k1, k2 = jax.random.key(1), jax.random.key(2)
    np.testing.assert_array_equal(run(k1), run(k1))
    assert not np.allclose(run(k1), run(k2))
    np.testing.assert_array_equal(run(k1, 0.0), jax_flash.attention(q, k, v))


def test_minus_inf_bias_and_fully_masked_rows(rng):
    q, k, v = random_qkv(rng, 1, 20, 20, 2, 2, 16, "float32")
    bias = jnp.where(jnp.arange(20)[None, None, :, None] < 5, -jnp.inf, 0.0)  # rows 0-4 see nothing
    bias = jnp.broadcast_to(bias, (1, 2, 20, 20))
    out = jax_flash.attention(q, k, v, bias)
    grads = jax.grad(lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v, bias) ** 2), (0, 1, 2))(q, k, v)
    assert np.all(np.isfinite(out)) and all(np.all(np.isfinite(g)) for g in grads)
    np.testing.assert_array_equal(out[:, :5], 0.0)
    np.testing.assert_array_equal(grads[0][:, :5], 0.0)
    ref = reference.attention(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), to_f64_cpu(bias))
    assert_close("out", out, ref, "float32")


def _jax_xla_windows() -> bool:
    """Whether jax.nn.dot_product_attention(implementation="xla") applies a
    non-causal local window (jax 0.5.0's returns the unwindowed result)."""
    x = jnp.arange(8.0).reshape(1, 4, 1, 2)
    plain = jax.nn.dot_product_attention(x, x, x, implementation="xla")
    windowed = jax.nn.dot_product_attention(x, x, x, implementation="xla", local_window_size=(0, 0))
    return not np.allclose(plain, windowed)


@pytest.mark.parametrize("case", ["bias_full", "bias_key_padding", "mask_key_padding",
                                  "mask_full", "seq_lengths", "window", "window_int_causal"])
def test_drop_in_against_jax_xla(rng, case):
    """Same arguments through jax.nn.dot_product_attention; rows with a visible key."""
    q, k, v = random_qkv(rng, B, T, S, N, K, H, "float32")
    bias, kwargs, _ = _split(_features(case, rng))
    if "local_window_size" in kwargs and not kwargs.get("is_causal") and not _jax_xla_windows():
        pytest.skip("this jax's implementation='xla' ignores local_window_size without is_causal")
    ours = jax_flash.attention(q, k, v, bias, **kwargs)
    with jax.default_matmul_precision("highest"):
        theirs = jax.nn.dot_product_attention(q, k, v, bias, implementation="xla", **kwargs)
    vis = reference.visibility(B, N, T, S, **{k: v for k, v in kwargs.items()})
    rows = np.swapaxes(np.asarray(vis.any(-1)), 1, 2)[..., None]  # [B, T, N, 1]
    np.testing.assert_allclose(np.where(rows, ours, 0), np.where(rows, theirs, 0), rtol=2e-5, atol=2e-5)


def test_bias_gradient_is_not_computed_unless_asked(rng):
    q, k, v = random_qkv(rng, 1, 16, 16, 2, 2, 16, "float32")
    bias = jnp.zeros((1, 2, 16, 16))
    only_q = jax.jit(jax.grad(lambda q: jnp.sum(jax_flash.attention(q, k, v, bias)))).lower(q)
    with_bias = jax.jit(jax.grad(lambda b: jnp.sum(jax_flash.attention(q, k, v, b)))).lower(bias)
    assert "jax_flash_dbias" not in only_q.compile().as_text()
    assert "jax_flash_dbias" in with_bias.compile().as_text()


def test_vmap_with_bias_and_mask(rng):
    q, k, v = random_qkv(rng, 3, 17, 19, 2, 1, 16, "float32")
    bias = jnp.asarray(rng.standard_normal((3, 2, 17, 19)), jnp.float32)
    mask = jnp.asarray(rng.random((1, 1, 1, 19)) > 0.2)
    fn = lambda q, k, v, b: jax_flash.attention(q, k, v, b, mask[0], is_causal=True)
    got = jax.vmap(fn)(q, k, v, bias)  # per-example [T, N, H] inputs, [N, T, S] bias
    want = jax_flash.attention(q, k, v, bias, mask, is_causal=True)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    dbias = jax.grad(lambda b: jnp.sum(jax.vmap(fn, in_axes=(0, 0, 0, None))(q, k, v, b) ** 2))(bias[0])
    want_db = jax.grad(lambda b: jnp.sum(jax_flash.attention(q, k, v, b[None], mask, is_causal=True) ** 2))(bias[0])
    np.testing.assert_allclose(dbias, want_db, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(bias=np.zeros((2, 3, 45, 70), np.float32)), ValueError, r"bias shape .* does not broadcast"),
        (dict(bias=np.zeros((45, 70), np.int32)), TypeError, "bias must be a float array"),
        (dict(mask=np.ones((2, 1, 1, 70), np.int32)), TypeError, "mask must be bool"),
        (dict(mask=np.ones((2, 1, 1, 1, 70), bool)), ValueError, "mask must have at most 4 dims"),
        (dict(query_seq_lengths=np.ones((2,), np.int64)), TypeError, "query_seq_lengths must be int32"),
        (dict(key_value_seq_lengths=np.ones((3,), np.int32)), ValueError,
         r"key_value_seq_lengths must have shape \(2,\)"),
        (dict(q_segment_ids=np.zeros((2, 45), np.int32)), ValueError, "must be given together"),
        (dict(local_window_size=(-1, 2)), ValueError, "must be non-negative"),
        (dict(logits_soft_cap=0.0), ValueError, "logits_soft_cap must be a positive"),
        (dict(dropout_rate=0.1), ValueError, "needs dropout_rng"),
        (dict(dropout_rate=1.0, dropout_rng=jax.random.key(0)), ValueError, r"dropout_rate must be in \[0, 1\)"),
    ],
)
def test_feature_argument_errors(rng, kwargs, error, match):
    q, k, v = random_qkv(rng, B, T, S, N, K, H, "float32")
    with pytest.raises(error, match=match):
        jax_flash.attention(q, k, v, **kwargs)


def test_vmap_over_a_per_query_mask(rng):
    """vmap over 16-bit inputs and a per-query mask that differs per mapped
    entry (on the GPU the kernels take its block summary, computed inside
    the mapped call): each entry as its own call, out and the gradients."""
    v_, b, t, n, h = 3, 1, 200, 2, 64
    q, k, v = (jnp.asarray(rng.standard_normal((v_, b, t, n, h)), jnp.bfloat16) for _ in range(3))
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    prefixes = (20, 90, 150)  # prefix-LM masks, one per entry: blocks hidden, visible and mixed
    mask = jnp.asarray(np.stack([(j < np.maximum(i + 1, p))[None, None] for p in prefixes]))  # [V, 1, 1, T, S]
    dout = jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16)
    f = lambda q, k, v, m: jax_flash.attention(q, k, v, mask=m)
    loss = lambda q, k, v, m, d: jnp.sum(f(q, k, v, m).astype(jnp.float32) * d.astype(jnp.float32))
    got = jax.vmap(f)(q, k, v, mask)
    grads = jax.vmap(jax.grad(loss, (0, 1, 2)))(q, k, v, mask, dout)
    for e in range(v_):
        np.testing.assert_allclose(np.asarray(got[e], np.float32), np.asarray(f(q[e], k[e], v[e], mask[e]), np.float32),
                                   rtol=1e-2, atol=1e-2)
        want = jax.grad(loss, (0, 1, 2))(q[e], k[e], v[e], mask[e], dout[e])
        for name, a, w in zip(("dq", "dk", "dv"), grads, want):
            np.testing.assert_allclose(np.asarray(a[e], np.float32), np.asarray(w, np.float32), rtol=2e-2, atol=2e-2,
                                       err_msg=name)


def test_nested_vmap_with_bias_mask_and_lengths(rng):
    """Three leading batch dims reach the kernels; bias stays shared, its gradient sums."""
    q = jnp.asarray(rng.standard_normal((2, 3, 2, 11, 2, 16)), jnp.float32)  # [V1, V2, B, T, N, H]
    bias = jnp.asarray(rng.standard_normal((2, 1, 11, 11)), jnp.float32)
    mask = jnp.asarray(rng.random((1, 1, 1, 11)) > 0.2)
    lengths = jnp.array([11, 7], jnp.int32)
    f = lambda q, b: jax_flash.attention(q, q, q, b, mask, key_value_seq_lengths=lengths)
    nested = jax.vmap(jax.vmap(f, in_axes=(0, None)), in_axes=(0, None))
    loop = [(i, j) for i in range(2) for j in range(3)]
    got = nested(q, bias)
    for i, j in loop:
        np.testing.assert_array_equal(got[i, j], f(q[i, j], bias))
    dbias = jax.grad(lambda b: jnp.sum(nested(q, b) ** 2))(bias)
    want = sum(jax.grad(lambda b: jnp.sum(f(q[i, j], b) ** 2))(bias) for i, j in loop)
    np.testing.assert_allclose(dbias, want, rtol=1e-5, atol=1e-5)


def test_dropout_with_bias_gradient(rng):
    """dbias sees the same dropout mask as the forward (and dq/dk/dv)."""
    q, k, v = random_qkv(rng, B, T, S, N, K, H, "float32")
    bias = jnp.asarray(rng.standard_normal((1, N, T, S)), jnp.float32)
    key = jax.random.key(11)
    factor = to_f64_cpu(reference.dropout_factor(jax.random.bits(key, (2,), jnp.uint32), B, N, T, S, 0.2))
    dout = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    ours = jax.grad(lambda *a: jnp.sum(jax_flash.attention(
        *a, dropout_rate=0.2, dropout_rng=key, is_causal=True) * dout), (0, 1, 2, 3))(q, k, v, bias)
    ref = jax.grad(lambda *a: jnp.sum(reference.attention(
        *a, dropout_factor=factor, is_causal=True) * to_f64_cpu(dout)), (0, 1, 2, 3))(
        to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), to_f64_cpu(bias))
    for name, a, r in zip(("dq", "dk", "dv", "dbias"), ours, ref):
        assert_close(name, a, r, "float32", factor=GRAD_FACTOR)


def _check_bf16_against_reference(rng, q, k, v, kwargs, ref_kwargs):
    """bf16 output and the gradients of q, k, v (through jax.grad, with a
    random output cotangent) against the float64 reference."""
    dout = jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16)
    out = jax_flash.attention(q, k, v, **kwargs)
    ref_out = reference.attention(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), **ref_kwargs)
    assert_close("out", out, ref_out, "bfloat16")
    grads = jax.grad(lambda *a: jnp.sum(jax_flash.attention(*a, **kwargs).astype(jnp.float32)
                                        * dout.astype(jnp.float32)), (0, 1, 2))(q, k, v)
    ref_grads = jax.grad(lambda *a: jnp.sum(reference.attention(*a, **ref_kwargs) * to_f64_cpu(dout)),
                         (0, 1, 2))(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v))
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(name, g, r, "bfloat16", factor=GRAD_FACTOR)


def _key_block_mask(rng, b, n, s, per_head):
    """A key-only mask ([b, n or 1, 1, s]) made of 32-key chunks that are all
    visible, all hidden or random, the pattern shifted per batch row (and per
    head): the tensor-core feature kernels skip the hidden blocks and drop the
    mask check in the visible ones. Batch row 0 hides keys 0-127 (a whole
    backward key block: no steps) and row 1 keys 128-255."""
    heads = n if per_head else 1
    chunk = np.arange(s) // 32
    kind = (chunk[None, None, :] + np.arange(b)[:, None, None] + np.arange(heads)[None, :, None]) % 3
    mask = np.where(kind == 0, True, np.where(kind == 1, False, rng.random((b, heads, s)) > 0.5))
    mask[0, :, :128] = False
    mask[1, :, 128:256] = False
    return jnp.asarray(mask[:, :, None, :])


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per_head"])
def test_key_only_mask_whole_blocks(rng, head_dim, is_causal, per_head):
    """Key-only masks that hide whole kernel blocks, leave whole blocks visible
    or mix, with GQA (per-head masks give the heads of a key head different
    blocks) and causal rows that see nothing: bf16 forward and gradients
    against the float64 reference."""
    b, t, s, n, kh, h = 2, 300, 330, 4, 2, head_dim
    q, k, v = random_qkv(rng, b, t, s, n, kh, h, "bfloat16")
    kwargs = dict(mask=_key_block_mask(rng, b, n, s, per_head), is_causal=is_causal)
    _check_bf16_against_reference(rng, q, k, v, kwargs, kwargs)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("case", ["mask_key_padding", "seq_lengths", "window", "everything", "dropout",
                                  "soft_cap", "soft_cap_dropout"])
def test_features_across_many_blocks(rng, case, head_dim):
    """Lengths past several kernel blocks (128/64 rows), bf16, every padded head
    dim: the tensor-core feature kernels on a GPU skip and mask whole blocks."""
    b, t, s, n, kh, h = 2, 300, 260, 4, 2, head_dim
    q, k, v = random_qkv(rng, b, t, s, n, kh, h, "bfloat16")
    kwargs = {
        "mask_key_padding": dict(mask=jnp.asarray(np.arange(s) < np.array([[s], [170]]))[:, None, None, :]),
        "seq_lengths": dict(query_seq_lengths=jnp.array([t, 150], jnp.int32),
                            key_value_seq_lengths=jnp.array([90, s], jnp.int32), is_causal=True),
        "window": dict(local_window_size=(100, 40)),
        "everything": dict(mask=jnp.asarray(rng.random((b, 1, 1, s)) > 0.1), is_causal=True,
                           local_window_size=(150, 0), logits_soft_cap=3.0,
                           key_value_seq_lengths=jnp.array([s, 200], jnp.int32)),
        "dropout": dict(dropout_rate=0.25, dropout_rng=jax.random.key(4), is_causal=True),
        # Non-causal: whole blocks with nothing to mask but the transform (and
        # saturating: the cap is below most logits' size).
        "soft_cap": dict(logits_soft_cap=0.7),
        "soft_cap_dropout": dict(logits_soft_cap=1.5, dropout_rate=0.25, dropout_rng=jax.random.key(5)),
    }[case]
    ref_kwargs = {k_: v_ for k_, v_ in kwargs.items() if k_ not in ("dropout_rate", "dropout_rng")}
    if "dropout" in case:
        ref_kwargs["dropout_factor"] = to_f64_cpu(reference.dropout_factor(
            jax.random.bits(kwargs["dropout_rng"], (2,), jnp.uint32), b, n, t, s, 0.25))
    _check_bf16_against_reference(rng, q, k, v, kwargs, ref_kwargs)


def _document_ids(rng, b, n, kind):
    """Segment ids [b, n] of one kind: "packed" documents (sorted runs 0, 1, 2,
    ... of random lengths, one run of 64-aligned documents in batch row 0),
    "reused" (runs whose ids come back later: not contiguous), or "random"
    (an id per position)."""
    if kind == "random":
        return jnp.asarray(rng.integers(0, 3, (b, n)), jnp.int32)
    ids = np.zeros((b, n), np.int32)
    for row in range(b):
        if kind == "packed" and row == 0:
            ids[row] = np.arange(n) // 128  # documents on whole kernel blocks
            continue
        pos, doc = 0, 0
        while pos < n:
            run = int(rng.integers(20, 200))
            ids[row, pos:pos + run] = doc
            pos += run
            doc = doc + 1 if kind == "packed" else int(rng.integers(0, 3))
    return jnp.asarray(ids)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("kind", ["packed", "reused", "random"])
def test_segments_across_many_blocks(rng, kind, is_causal, head_dim):
    """Packed documents over several kernel blocks, bf16, GQA: the kernels skip
    the blocks of other documents (by the ids' block summaries) and drop the id
    check where a block holds one document; reused and random ids take the
    per-element path. Forward and gradients against the float64 reference."""
    b, t, n, kh, h = 2, 520, 4, 2, head_dim
    q, k, v = random_qkv(rng, b, t, t, n, kh, h, "bfloat16")
    ids = _document_ids(rng, b, t, kind)
    kwargs = dict(q_segment_ids=ids, kv_segment_ids=ids, is_causal=is_causal)
    _check_bf16_against_reference(rng, q, k, v, kwargs, kwargs)


@pytest.mark.parametrize("case", ["packed_causal", "window_lengths"])
def test_features_with_many_tiles_per_block(rng, case):
    """More query tiles than a GPU has SMs, several times over (3 x 12 x 8 =
    288 tiles of 128 rows): the sm90 forward's feature variants then take
    their tiles from a counter as blocks come free (fwd_kernel.cuh,
    for_each_taken_tile), each after the block's first; a tile taken twice
    or never would leave rows wrong. Packed documents of random lengths
    (their tiles' costs vary with the documents, which is why the tiles are
    taken), and a window with key lengths. bf16, forward and gradients
    against the float64 reference; on the CPU its blocks."""
    b, t, n, kh, h = 3, 1024, 12, 4, 64
    q, k, v = random_qkv(rng, b, t, t, n, kh, h, "bfloat16")
    if case == "packed_causal":
        ids = _document_ids(rng, b, t, "packed")
        kwargs = dict(q_segment_ids=ids, kv_segment_ids=ids, is_causal=True)
    else:
        kwargs = dict(local_window_size=(300, 0), is_causal=True,
                      key_value_seq_lengths=jnp.array([t, 700, 333], jnp.int32))
    _check_bf16_against_reference(rng, q, k, v, kwargs, kwargs)


def test_segments_with_lengths_window_and_mask_float32(rng):
    """Segment summaries combined with everything else that hides keys, at
    float32 (the generic kernels on a GPU, the CPU's blocks here) with a
    query length different from the key length."""
    b, t, s, n, kh, h = 2, 333, 400, 2, 1, 32
    q, k, v = random_qkv(rng, b, t, s, n, kh, h, "float32")
    kwargs = dict(q_segment_ids=_document_ids(rng, b, t, "packed"),
                  kv_segment_ids=_document_ids(rng, b, s, "packed"), is_causal=True,
                  local_window_size=(150, 0), key_value_seq_lengths=jnp.array([s, 290], jnp.int32),
                  mask=jnp.asarray(rng.random((b, 1, 1, s)) > 0.1))
    dout = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    out = jax_flash.attention(q, k, v, **kwargs)
    assert_close("out", out, reference.attention(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), **kwargs),
                 "float32")
    grads = jax.grad(lambda *a: jnp.sum(jax_flash.attention(*a, **kwargs) * dout), (0, 1, 2))(q, k, v)
    ref = jax.grad(lambda *a: jnp.sum(reference.attention(*a, **kwargs) * to_f64_cpu(dout)), (0, 1, 2))(
        to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v))
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        assert_close(name, g, r, "float32", factor=GRAD_FACTOR)


@pytest.mark.parametrize("is_causal", [False, True])
def test_soft_cap_float16(rng, is_causal):
    """float16 (11 mantissa bits: the tightest 16-bit tolerance) with a soft
    cap, over several kernel blocks: the tensor-core kernels' fast tanh keeps
    the output and gradients within float16's tolerance."""
    b, t, n, h = 2, 300, 2, 128
    q, k, v = random_qkv(rng, b, t, t, n, n, h, "float16")
    kwargs = dict(logits_soft_cap=1.5, is_causal=is_causal)
    dout = jnp.asarray(rng.standard_normal(q.shape), jnp.float16)
    out = jax_flash.attention(q, k, v, **kwargs)
    assert_close("out", out, reference.attention(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), **kwargs),
                 "float16")
    grads = jax.grad(lambda *a: jnp.sum(jax_flash.attention(*a, **kwargs).astype(jnp.float32)
                                        * dout.astype(jnp.float32)), (0, 1, 2))(q, k, v)
    ref = jax.grad(lambda *a: jnp.sum(reference.attention(*a, **kwargs) * to_f64_cpu(dout)), (0, 1, 2))(
        to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v))
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        assert_close(name, g, r, "float16", factor=GRAD_FACTOR)
