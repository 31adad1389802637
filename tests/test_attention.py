"""Forward and backward against the float64 reference, every element checked."""

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash import _kernel_call, reference
from helpers import (
    FLOAT_DTYPES,
    GRAD_FACTOR,
    ON_GPU,
    ON_HOPPER,
    assert_close,
    random_qkv,
    reference_f64,
    reference_grads_f64,
    to_f64_cpu,
)

HEAD_DIMS = [16, 20, 40, 64, 80, 128, 256]  # 20: not a multiple of 8 (generic kernels only)
# On a GPU, run every forward case through the auto-selected kernels and
# again through the generic ones, so both families stay covered.
IMPLEMENTATIONS = [None, "generic"] if ON_GPU else [None]
# (seqlen_q, seqlen_k): single tokens, odd lengths, Tq != Tk both ways, and
# lengths past one kernel block (64 on the CPU, 32 on the GPU).
LENGTHS = [(1, 1), (17, 17), (97, 33), (33, 97), (130, 130)]


def _skip_unsupported(dtype):
    if ON_GPU and dtype == "float64":
        pytest.skip("float64 runs on the CPU only (test_float64_on_gpu_is_a_clear_error)")


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=lambda i: i or "auto")
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda l: f"T{l[0]}S{l[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda h: f"H{h}")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward(rng, dtype, head_dim, causal, lengths, implementation):
    _skip_unsupported(dtype)
    tq, tk = lengths
    q, k, v = random_qkv(rng, 2, tq, tk, 4, 2, head_dim, dtype)
    scale = 0.7 / np.sqrt(head_dim)  # a custom scale, not the default
    out, residual = jax.jit(
        lambda q, k, v: jax_flash.attention(
            q, k, v, scale=scale, is_causal=causal, return_residual=True,
            implementation=implementation,
        )
    )(q, k, v)
    ref_out, ref_lse = reference_f64(q, k, v, scale=scale, is_causal=causal)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert residual.dtype == q.dtype and residual.shape == q.shape[:-1]
    assert_close("out", out, ref_out, dtype)
    assert_close("lse", residual, np.swapaxes(ref_lse, -1, -2), dtype)


# Tq = 199: the last 7 query rows are a partial 8-row group of the GPU's
# blocked dQ accumulator (ffi/cuda/sm80/dq_accum.cuh), stored row-major.
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=lambda i: i or "auto")
@pytest.mark.parametrize("lengths", [(17, 17), (97, 33), (33, 130), (199, 300)], ids=lambda l: f"T{l[0]}S{l[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda h: f"H{h}")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gradients(rng, dtype, head_dim, causal, lengths, implementation):
    _skip_unsupported(dtype)
    tq, tk = lengths
    q, k, v = random_qkv(rng, 2, tq, tk, 4, 2, head_dim, dtype)
    dout = jnp.asarray(rng.standard_normal(q.shape), dtype)

    acc = jnp.promote_types(dtype, jnp.float32)

    def loss(q, k, v):
        out = jax_flash.attention(q, k, v, is_causal=causal, implementation=implementation)
        return jnp.sum(out.astype(acc) * dout.astype(acc))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    ref = reference_grads_f64(q, k, v, dout, is_causal=causal)
    for name, g, r, x in zip(("dq", "dk", "dv"), grads, ref, (q, k, v)):
        assert g.dtype == x.dtype and g.shape == x.shape
        assert_close(name, g, r, dtype, factor=GRAD_FACTOR)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_error_at_most_twice_naive(rng, dtype):
    """DESIGN.md numerics: error vs float64 at most ~2x that of the same math in the input dtype."""
    q, k, v = random_qkv(rng, 2, 200, 200, 4, 4, 64, dtype)
    ref_out, _ = reference_f64(q, k, v, is_causal=True)
    ours = np.asarray(jax_flash.attention(q, k, v, is_causal=True), np.float64)
    # Naive: logits, softmax and the weighted sum all rounded to the input dtype.
    logits = jnp.einsum("btnh,bsnh->bnts", q, k) * jnp.asarray(1 / 8, dtype)
    logits = jnp.where(jnp.tril(jnp.ones((200, 200), bool)), logits, -jnp.inf)
    naive = jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(logits, axis=-1).astype(dtype), v)
    err_ours = np.abs(ours - ref_out).max()
    err_naive = np.abs(np.asarray(naive, np.float64) - ref_out).max()
    assert err_ours <= 2 * err_naive, (err_ours, err_naive)


def test_unbatched_inputs(rng):
    """[T, N, H] inputs work as in jax.nn.dot_product_attention."""
    q, k, v = random_qkv(rng, 1, 19, 23, 2, 2, 32, "float32")
    out = jax_flash.attention(q[0], k[0], v[0])
    assert out.shape == q.shape[1:]
    ref_out, _ = reference_f64(q, k, v)
    assert_close("out", out, ref_out[0], "float32")


@pytest.mark.parametrize("causal", [False, True])
def test_matches_jax_dot_product_attention(rng, causal):
    """Drop-in: the same call through jax.nn.dot_product_attention agrees."""
    q, k, v = random_qkv(rng, 2, 40, 40, 8, 2, 64, "float32")
    ours, ours_res = jax_flash.attention(q, k, v, is_causal=causal, return_residual=True)
    # Older jax (< 0.6) has no return_residual: compare the outputs alone there.
    residual = "return_residual" in inspect.signature(jax.nn.dot_product_attention).parameters
    kw = {"return_residual": True} if residual else {}
    with jax.default_matmul_precision("highest"):  # no TF32 on GPUs
        theirs = jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla", **kw)
    if residual:
        theirs, theirs_res = theirs
        np.testing.assert_allclose(ours_res, theirs_res, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=2e-5)


def test_large_logits_stay_finite(rng):
    """Online softmax must not overflow where exp(logit) would."""
    q, k, v = random_qkv(rng, 1, 70, 70, 2, 2, 64, "float32")
    q = q * 60.0  # logits in the thousands
    out = jax_flash.attention(q, k, v)
    ref_out, _ = reference_f64(q, k, v)
    assert_close("out", out, ref_out, "float32", factor=10)


@pytest.mark.skipif(not ON_GPU, reason="kernel families are a GPU matter")
def test_forced_sm80_rejects_unsupported_inputs(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 64, "float32")
    with pytest.raises(Exception, match="implementation='sm80' needs float16/bfloat16"):
        jax.block_until_ready(jax_flash.attention(q, k, v, implementation="sm80"))


@pytest.mark.skipif(not ON_HOPPER, reason="the sm90 family needs a compute capability 9.x GPU")
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_forced_sm90_matches_reference(rng, head_dim, causal):
    """The Hopper forward, forced: tails in both lengths, GQA, bf16; its
    gradients come from the sm80 backward on its out and lse."""
    q, k, v = random_qkv(rng, 2, 333, 517, 4, 2, head_dim, "bfloat16")
    out, lse = jax_flash.attention(q, k, v, is_causal=causal, implementation="sm90", return_residual=True)
    ref_out, ref_lse = reference_f64(q, k, v, is_causal=causal)
    assert_close("out", out, ref_out, "bfloat16")
    assert_close("lse", lse, np.swapaxes(ref_lse, -1, -2), "bfloat16")
    dout = jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16)
    grads = jax.grad(lambda *a: jnp.sum(
        jax_flash.attention(*a, is_causal=causal, implementation="sm90").astype(jnp.float32) * dout),
        argnums=(0, 1, 2))(q, k, v)
    for name, g, w in zip(("dq", "dk", "dv"), grads, reference_grads_f64(q, k, v, dout, is_causal=causal)):
        assert_close(name, g, w, "bfloat16", GRAD_FACTOR)


@pytest.mark.skipif(not ON_HOPPER, reason="the sm90 family needs a compute capability 9.x GPU")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sm90_backward_at_256_over_sections(rng, dtype, causal, monkeypatch):
    """The sm90 backward at 256 (bwd256_kernel.cuh: 64-key tiles, the two
    consumer warpgroups splitting the head dim) over 24 (batch, key head)
    pairs of 9 key blocks each, so that the causal tile order runs in
    sections (BackwardCausalSection: 16 pairs of 128+ tiles), GQA 2:1 in
    the kernel (no key head copies: at this size key_head_copies would give
    every query head its own, and the kernel a group of 1), a key tail (520
    keys: 8 keys in the last block) and a query tail (517 queries: the last
    step's dQ rows 512 .. 516 a partial 8-row group of the accumulator);
    every element of dq, dk, dv against float64."""
    monkeypatch.setattr(_kernel_call, "_TARGET_BLOCKS_PER_SM", 0)
    q, k, v = random_qkv(rng, 3, 517, 520, 16, 8, 256, dtype)
    dout = jnp.asarray(rng.standard_normal(q.shape), dtype)

    def loss(q, k, v):
        out = jax_flash.attention(q, k, v, is_causal=causal, implementation="sm90")
        return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    ref = reference_grads_f64(q, k, v, dout, is_causal=causal)
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        assert_close(name, g, r, dtype, factor=GRAD_FACTOR)


@pytest.mark.skipif(not ON_HOPPER, reason="which sm90 kernels serve a call (an H100 / H200's kernels)")
def test_sm90_dispatch_at_256(rng):
    """The dispatch at head dim 256, seen through the launchers' record (sm80's
    kernels would compute the same values). Forward: lengths, a window and
    segment ids run the sm90 forward's kMasks variant ("with masks"), the
    soft cap kPlainSoftcap alone and kSoftcap beside a window, plain calls
    the plain kernel; on 64-key blocks a boolean mask kMasksBoolean,
    beside the soft cap kMasksSoftcap, dropout kPlainDropout alone and
    kMasksDropout beside the masks (a key-padding mask too); a bias sm80's
    forward. Backward: the masks' features and a boolean mask run
    Backward256Kernel's kMasks variant, plain calls its plain one, the
    soft cap (beside them, a dense boolean mask too) kMasksSoftcap,
    dropout kMasksDropout; a bias sm80's backward. Every
    element of out and the gradients against float64 too, for the feature
    cases (dropout's against the reference's own factors)."""
    from jax_flash import _ffi

    b, t, n, kh = 2, 200, 4, 2
    q, k, v = random_qkv(rng, b, t, t, n, kh, 256, "bfloat16")
    ids = jnp.asarray(np.repeat(np.arange(3), [70, 64, t - 134])[None].repeat(b, 0), jnp.int32)
    cases = [  # kwargs, the sm90 forward's and backward's description suffixes (None: no sm90 launch)
        (dict(), "", ""),
        (dict(is_causal=True, q_segment_ids=ids, kv_segment_ids=ids), " with masks", " with masks"),
        (dict(local_window_size=(50, 10)), " with masks", " with masks"),
        (dict(key_value_seq_lengths=jnp.asarray([t, 111], jnp.int32)), " with masks", " with masks"),
        (dict(mask=jnp.asarray(rng.random((b, 1, 1, t)) > 0.3)), " with masks and boolean mask", " with masks"),
        (dict(mask=jnp.asarray(rng.random((b, n, t, t)) > 0.3), is_causal=True), " with masks and boolean mask",
         " with masks"),
        (dict(logits_soft_cap=5.0), " with soft cap, causal or none", " with masks and soft cap"),
        (dict(logits_soft_cap=5.0, is_causal=True, local_window_size=(60, 0)),
         " with masks and soft cap, no boolean mask", " with masks and soft cap"),
        (dict(logits_soft_cap=5.0, mask=jnp.asarray(rng.random((b, 1, t, t)) > 0.2)), " with masks and soft cap",
         " with masks and soft cap"),
        (dict(dropout_rate=0.2, dropout_rng=jax.random.key(3), is_causal=True), " with dropout, causal or none",
         " with masks and dropout"),
        (dict(dropout_rate=0.2, dropout_rng=jax.random.key(5), local_window_size=(50, 10)), " with masks and dropout",
         " with masks and dropout"),
        (dict(dropout_rate=0.2, dropout_rng=jax.random.key(7), mask=jnp.asarray(rng.random((b, n, 1, t)) > 0.3)),
         " with masks and dropout", " with masks and dropout"),
        # A bias: sm80's forward and backward.
        (dict(bias=jnp.asarray(rng.standard_normal((b, n, t, t)), jnp.bfloat16), is_causal=True), None, None),
        (dict(bias=jnp.asarray(rng.standard_normal((b, 1, t, t)), jnp.float32), q_segment_ids=ids, kv_segment_ids=ids),
         None, None),
    ]
    dout = jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16)
    _ffi.record_kernels(True)
    try:
        for kwargs, forward_suffix, backward_suffix in cases:
            def loss(q, k, v, kw=kwargs):
                out = jax_flash.attention(q, k, v, **kw)
                return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32)), out
            (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)
            jax.block_until_ready(grads)
            launched = _ffi.recorded_kernels()
            for family, suffix in (("forward", forward_suffix), ("backward", backward_suffix)):
                names = [name for name in launched if f"sm90 {family} kernel" in name]
                if suffix is None:
                    assert not names, (kwargs, family, names)
                    continue
                assert len(names) == 1 and "in 256)" in names[0], (kwargs, family, names)
                assert names[0].endswith(")" + suffix), (kwargs, family, names)
            if kwargs:
                ref_kwargs = dict(kwargs)
                if "dropout_rng" in ref_kwargs:
                    words = jax.random.bits(ref_kwargs.pop("dropout_rng"), (2,), jnp.uint32)
                    ref_kwargs["dropout_factor"] = to_f64_cpu(
                        reference.dropout_factor(words, b, n, t, t, ref_kwargs.pop("dropout_rate")))
                assert_close("out", out, reference_f64(q, k, v, **ref_kwargs)[0], "bfloat16")
                ref = reference_grads_f64(q, k, v, dout, **ref_kwargs)
                for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
                    assert_close(name, g, r, "bfloat16", factor=GRAD_FACTOR)
    finally:
        _ffi.record_kernels(False)


@pytest.mark.skipif(not ON_GPU, reason="kernel families are a GPU matter")
def test_forced_sm90_rejects_unsupported_inputs(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 64, "float32")
    with pytest.raises(Exception, match="implementation='sm90' needs a GPU of compute capability 9.x"):
        jax.block_until_ready(jax_flash.attention(q, k, v, implementation="sm90"))


def test_sm80_forward_long_rows(rng):
    """Several key and query blocks, causal and not, bf16 (mma path on a GPU)."""
    for causal in (False, True):
        q, k, v = random_qkv(rng, 1, 300, 520, 2, 1, 128, "bfloat16")
        out = jax_flash.attention(q, k, v, is_causal=causal)
        ref_out, _ = reference_f64(q, k, v, is_causal=causal)
        assert_close("out", out, ref_out, "bfloat16")


@pytest.mark.parametrize("head_dim", [128, 256], ids=lambda h: f"H{h}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("climb", [4.0, 40.0], ids=["gentle", "steep"])
def test_forward_row_maximum_moves_between_key_blocks(rng, climb, causal, head_dim):
    """Logits on a ramp along the keys, rising for half the query rows and
    falling for the other half, so a row's maximum grows by about `climb`
    log2 units per 32 keys in whichever order the kernel visits key blocks.
    Steep: the softmax offset has to move at nearly every block; gentle: it
    lags the running maximum (probabilities above 1 before normalizing).
    At 256 the GPU forward's warp pairs each see half of a key block's
    columns, so the maximum often moves in one half only.
    """
    b, tq, tk, heads = 1, 256, 640, 2
    q, k, v = (np.asarray(x, np.float32) for x in random_qkv(rng, b, tq, tk, heads, heads, head_dim, "bfloat16"))
    scale = 1.0 / np.sqrt(head_dim)
    # logit(i, j) gains sign_i * 16 * ramp_j * scale from dimension 0.
    ramp = np.arange(tk) * (climb / np.log2(np.e) / 32 / (16 * scale))
    q[..., 0] = np.where(np.arange(tq) % 2 == 0, 16.0, -16.0)[None, :, None]
    k[..., 0] = (ramp - ramp.mean())[None, :, None]
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    out, residual = jax_flash.attention(q, k, v, is_causal=causal, return_residual=True)
    ref_out, ref_lse = reference_f64(q, k, v, is_causal=causal)
    assert_close("out", out, ref_out, "bfloat16")
    assert_close("lse", residual, np.swapaxes(ref_lse, -1, -2), "bfloat16")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [136, 192])
def test_head_dims_rounded_up_to_256(rng, head_dim, causal):
    """Head dims between the tensor-core kernels' 128 and 256 run the 256
    kernels with the columns past head_dim predicated off (on a GPU the
    forward's second warp of each pair owns output columns 128 on, 8 or 64
    of them here): forward, lse and gradients, bf16, tails and GQA."""
    q, k, v = random_qkv(rng, 2, 97, 130, 4, 2, head_dim, "bfloat16")
    dout = jnp.asarray(rng.standard_normal(q.shape), "bfloat16")
    out, residual = jax_flash.attention(q, k, v, is_causal=causal, return_residual=True)
    ref_out, ref_lse = reference_f64(q, k, v, is_causal=causal)
    assert_close("out", out, ref_out, "bfloat16")
    assert_close("lse", residual, np.swapaxes(ref_lse, -1, -2), "bfloat16")

    def loss(q, k, v):
        return jnp.sum(jax_flash.attention(q, k, v, is_causal=causal).astype(jnp.float32)
                       * dout.astype(jnp.float32))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    ref = reference_grads_f64(q, k, v, dout, is_causal=causal)
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        assert_close(name, g, r, "bfloat16", factor=GRAD_FACTOR)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_causal_over_several_launch_phases(rng, head_dim):
    """Causal bf16 forward and gradients with enough query and key blocks that
    the GPU kernels launch in a phased / key-block-major order (on an H200 the
    forward's 10 or 19 query blocks per head go in 2-3 phases), with batch,
    GQA and tails, against the float64 reference."""
    q, k, v = random_qkv(rng, 2, 1200, 1200, 4, 2, head_dim, "bfloat16")
    dout = jnp.asarray(rng.standard_normal(q.shape), "bfloat16")
    out = jax_flash.attention(q, k, v, is_causal=True)
    ref_out, _ = reference_f64(q, k, v, is_causal=True)
    assert_close("out", out, ref_out, "bfloat16")

    def loss(q, k, v):
        return jnp.sum(jax_flash.attention(q, k, v, is_causal=True).astype(jnp.float32)
                       * dout.astype(jnp.float32))

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    ref = reference_grads_f64(q, k, v, dout, is_causal=True)
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        assert_close(name, g, r, "bfloat16", factor=GRAD_FACTOR)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic_dq", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_backward_long_rows(rng, head_dim, causal, deterministic):
    """Several key and query blocks with tails, GQA, bf16 (the mma.sync backward on a GPU).

    Both backward modes match the reference; the deterministic one is also
    bitwise identical run to run.
    """
    q, k, v = random_qkv(rng, 2, 300, 520, 4, 2, head_dim, "bfloat16")
    dout = jnp.asarray(rng.standard_normal(q.shape), "bfloat16")

    def loss(q, k, v):
        out = jax_flash.attention(q, k, v, is_causal=causal, deterministic=deterministic)
        return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    grads = grad(q, k, v)
    ref = reference_grads_f64(q, k, v, dout, is_causal=causal)
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        assert_close(name, g, r, "bfloat16", factor=GRAD_FACTOR)
    if deterministic:
        again = grad(q, k, v)
        for name, g, h in zip(("dq", "dk", "dv"), grads, again):
            assert np.array_equal(np.asarray(g), np.asarray(h)), f"{name} changed between runs"


@pytest.mark.skipif(not ON_HOPPER, reason="the sm90 family needs a compute capability 9.x GPU")
@pytest.mark.parametrize("seqlen,heads,kv_heads", [(2048, 18, 18), (4096, 6, 2)], ids=["T2048", "T4096-gqa"])
def test_sm90_forward_at_256_over_many_tiles(rng, seqlen, heads, kv_heads):
    """The sm90 forward at 256 with several tiles per block (288 or 192
    tiles of 128 query rows on 132 blocks), causal: at T = 2048 in the
    L2-aware sections (tile_scheduler.cuh's DefaultCausalOrder: 2 MiB of
    K/V per key head; sections of 17 pairs and a last one of 1), at 4096 in
    order 0 (GQA 6:2); each tile's Q loaded while the previous tile's
    epilogue stores O from the registers (epilogue.cuh). Output and lse
    against the float64 reference, with rows past the last full tile
    (seqlen - 37)."""
    t = seqlen - 37
    q, k, v = random_qkv(rng, 1, t, t, heads, kv_heads, 256, "bfloat16")
    out, residual = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, is_causal=True, return_residual=True,
                                                                implementation="sm90"))(q, k, v)
    ref_out, ref_lse = reference_f64(q, k, v, is_causal=True)
    assert_close("out", out, ref_out, "bfloat16")
    assert_close("lse", residual, np.swapaxes(ref_lse, -1, -2), "bfloat16")


@pytest.mark.skipif(not ON_HOPPER, reason="the sm90 family needs a compute capability 9.x GPU")
@pytest.mark.parametrize("implementation", [None, "sm90"], ids=["auto", "sm90"])
@pytest.mark.parametrize("lengths", [(333, 517), (130, 97)], ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sm90_deterministic_backward(rng, dtype, head_dim, causal, lengths, implementation):
    """deterministic=True on a plain 16-bit call: the sm90 deterministic
    backward (dQ added in key block order), GQA with tails in both lengths.
    Bit for bit run to run (and under vmap, whose folded batch sizes the
    scratch), within rounding of the default (atomic dQ) backward and of the
    reference, and not sm80's two-pass result (which runs when the handler
    finds no scratch for the sm90 one: their dQ sums differ in order)."""
    tq, tk = lengths
    q, k, v = random_qkv(rng, 2, tq, tk, 4, 2, head_dim, dtype)
    dout = jnp.asarray(rng.standard_normal(q.shape), dtype)

    def grads_of(deterministic, impl=implementation):
        def loss(q, k, v):
            out = jax_flash.attention(q, k, v, is_causal=causal, deterministic=deterministic, implementation=impl)
            return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32))

        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))

    det = grads_of(True)
    grads = det(q, k, v)
    for name, g, h in zip(("dq", "dk", "dv"), grads, det(q, k, v)):
        assert np.array_equal(np.asarray(g), np.asarray(h)), f"{name} changed between runs"
    for name, g, d in zip(("dq", "dk", "dv"), grads, grads_of(False)(q, k, v)):
        assert_close(name, g, d, dtype, GRAD_FACTOR)
    for name, g, r in zip(("dq", "dk", "dv"), grads, reference_grads_f64(q, k, v, dout, is_causal=causal)):
        assert_close(name, g, r, dtype, GRAD_FACTOR)
    two_pass = grads_of(True, "sm80")(q, k, v)
    assert not np.array_equal(np.asarray(grads[0]), np.asarray(two_pass[0])), "dq is sm80's two-pass result"

    stacked = [jnp.stack([x, x[::-1]]) for x in (q, k, v)]
    batched = jax.jit(jax.vmap(det))
    first, again = batched(*stacked), batched(*stacked)
    for name, g, h, one in zip(("dq", "dk", "dv"), first, again, grads):
        assert np.array_equal(np.asarray(g), np.asarray(h)), f"vmapped {name} changed between runs"
        assert_close(f"vmapped {name}", g[0], one, dtype, GRAD_FACTOR)


def _backward_scratch_type(q, k, v, platform, **kwargs):
    """The dq_accum result type (its MLIR tensor type) of the backward call
    in grad(attention) lowered for `platform` (no device needed)."""

    def loss(q, k, v):
        return jnp.sum(jax_flash.attention(q, k, v, **kwargs).astype(jnp.float32))

    exp = jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=(platform,),
                            disabled_checks=jax_flash.export_safety_checks())(q, k, v)
    calls = [line for line in exp.mlir_module().splitlines() if "@jax_flash_bwd_" in line]
    assert len(calls) == 1, calls
    return re.findall(r"tensor<[^>]*>", calls[0].split("->")[-1])[-1]


@pytest.mark.skipif(not jax_flash.build_info().get("cuda_sm90_deterministic_backward", False),
                    reason="a build without the deterministic sm90 backward")
@pytest.mark.parametrize(
    "head_dim, dtype, kwargs, sm90",
    [
        (64, "bfloat16", {}, True),
        (128, "float16", dict(is_causal=True, implementation="sm90"), True),
        (80, "bfloat16", {}, True),
        (256, "bfloat16", {}, True),  # the 256 kernel's deterministic variant (since session 31)
        (64, "float32", {}, False),
        (64, "bfloat16", dict(implementation="sm80"), False),
        (64, "bfloat16", dict(implementation="generic"), False),
        (64, "bfloat16", dict(local_window_size=(16, 0)), False),
        (64, "bfloat16", dict(logits_soft_cap=30.0), False),
    ],
    ids=["h64", "h128_causal_sm90", "h80", "h256", "f32", "sm80", "generic", "window", "softcap"],
)
def test_deterministic_scratch_at_trace_time(rng, head_dim, dtype, kwargs, sm90):
    """deterministic=True lowered for CUDA without a GPU: plain 16-bit calls
    up to head dim 256 ("auto" or "sm90") get the deterministic sm90
    backward's flat scratch (the dQ accumulator, then its counters), every
    other call the empty one of before; the CPU's lowering keeps it empty."""
    q, k, v = random_qkv(rng, 2, 200, 150, 4, 2, head_dim, dtype)
    floats = 2 * 4 * 200 * head_dim + 2 * 4 * -(-200 // 64)
    want = f"tensor<{floats}xf32>" if sm90 else "tensor<0xf32>"
    assert _backward_scratch_type(q, k, v, "cuda", deterministic=True, **kwargs) == want
    assert _backward_scratch_type(q, k, v, "cpu", deterministic=True, **kwargs) == "tensor<0xf32>"
    if sm90 and "implementation" not in kwargs:  # the default backward's accumulator, as before
        got = _backward_scratch_type(q, k, v, "cuda", **kwargs)
        assert got == f"tensor<2x4x200x{head_dim}xf32>"


def test_negative_scale(rng):
    """A negative scale is valid (it flips the softmax); the fast path must not assume scale > 0."""
    q, k, v = random_qkv(rng, 1, 70, 90, 2, 2, 64, "bfloat16")
    out = jax_flash.attention(q, k, v, scale=-0.2)
    ref_out, _ = reference_f64(q, k, v, scale=-0.2)
    assert_close("out", out, ref_out, "bfloat16")


def test_deterministic_must_be_bool(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 2, 2, 16, "float32")
    with pytest.raises(TypeError, match="deterministic must be a Python bool"):
        jax_flash.attention(q, k, v, deterministic="yes")


def test_forward_compiles_to_the_kernel_call_alone():
    """jit(attention) without features is the FFI call and nothing else: no kernel
    of XLA's beside ours in every call (an unused placeholder operand once
    compiled to a broadcast, one more launch per call on the GPU)."""
    q = jnp.zeros((2, 128, 4, 64), jnp.bfloat16)
    hlo = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v)).lower(q, q, q).compile().as_text()
    entry = hlo[hlo.index("ENTRY"):]
    # "%name = <type, maybe a tuple> opcode(operands), ..." -> opcode
    ops = re.findall(r"%\S+ = (?:\([^)]*\)|\S+) ([\w-]+)\(", entry)
    assert "custom-call" in ops and set(ops) <= {"parameter", "constant", "custom-call", "get-tuple-element"}, ops
