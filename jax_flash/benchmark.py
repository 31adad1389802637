"""Times jax_flash beside its peers in one process: jax.nn.dot_product_attention
(cuDNN and XLA) and, when it imports, FlashAttention-3.

    python -m jax_flash.benchmark --help
    python -m jax_flash.benchmark --preset features   # the attention-features table
    python -m jax_flash.benchmark --preset decode     # decoding latency (jax_flash/benchmark_decode.py)

Method: for each point, every implementation is jitted, run once to compile
and warm up, then timed `--iters` times; the median is reported. A sample is
`calls` back-to-back calls blocked on once, divided by `calls`, where `calls`
makes a sample last at least --min-sample-ms (100 ms), so the host's dispatch
and the wait on the result are not counted as kernel time. (Through
2026-11-30 v13 the floor was 5 ms: a fwd+bwd call longer than that was one
blocked call per sample, which added 0.1-0.25 ms to the backward (up to 9%
of it at T <= 4096, ~1% at 16384) while the shorter forwards were several
calls; scripts/backward_timing.py measured it against the backward alone.
0 gives one blocked call per sample, the method before v7.)
Forward = jit(attention); backward = (jitted forward + backward) minus forward,
where forward + backward is, by --cotangent: `sum` (default; the method of every
result through v10), value_and_grad of sum(attention(...)), which also counts
the loss's reduction and XLA's broadcast of its cotangent (the broadcast alone
41 us at B*N*T*H = 33.5M on the H200, in docs/perf_history.md's v10 kernel timeline;
the reduction not timed apart); or `random`, the VJP of attention applied to a given
random dO, the backward alone, as FlashAttention's benchmark and PyTorch's
`out.backward(dout)` time it.

Implementations (--impl): jax_flash (jax_flash_sm80: forced onto the mma.sync kernels,
implementation="sm80"; jax_flash_deterministic: deterministic=True,
no dQ atomics; jax_flash_deterministic_sm80: the same on the sm80 kernels, the
two-pass backward the Hopper one replaced); cudnn and xla, jax.nn.dot_product_attention's; fa3,
FlashAttention-3's flash_mha / flash_mha_varlen from dew_flash_attn
(../shared/peers/fa3_for_jax.sh installs it; bf16/fp16; its causal mask is
bottom-right aligned, the same as the others' top-left here, where T == S). The
default list has fa3 only when dew_flash_attn imports and a GPU runs it, so runs
without it are unchanged; asked for and absent, its rows say "fa3 not importable".

Variants (--variant, or --cases for a causal flag per variant). Each variant's
arrays are made once per point and passed to every implementation as arguments
of the jitted functions (a closed-over array would be an XLA constant):
  plain       no feature.
  segments    packed sequences: --documents (4) documents of equal length per
              row, as q_segment_ids = kv_segment_ids; fa3 runs its varlen call
              over the B * documents sequences (cu_seqlens, max_seqlen T/4).
  window      local_window_size (--window, 0): a query sees W keys back (fa3:
              window_size).
  gqa         key and value with N / --gqa-ratio (8) heads.
  kv_lengths  the last S/8 keys of every row are padding, as key_value_seq_lengths.
  mask        the same padding as a bool [B, 1, 1, S] mask (key_padding_mask is
              its earlier name, still accepted).
  prefix_lm   a per-query bool [1, 1, T, S] mask: query i sees keys
              j < max(i + 1, T / 4) (a prefix-LM, bidirectional over the first
              quarter and causal after it); the CUDA kernels skip its hidden
              blocks by its block summary (made inside the timed call).
  prefix_lm_softcap  the same mask with logits_soft_cap 30 (PaliGemma 2's
              attention: a Gemma 2 decoder with a prefix-LM mask).
  striped_mask a per-query bool [1, 1, T, S] mask hiding key j from query i where
              (i + j) % 10 == 0: 90% visible, every block mixed, so every
              block reads its mask bytes (an arbitrary mask's worst case).
  bias        a [1, N, T, S] bias in the inputs' dtype, the issue's. (Earlier runs:
              [B, N, T, S] float32, 4 GiB at B=4, T=4096; not comparable.)
  softcap     logits_soft_cap 30.
  dropout     dropout_rate 0.1 with a fixed dropout_rng.
  sinks       attention sinks (gpt-oss): one float32 logit per query head, drawn
              from a standard normal, joining every row's softmax with no value.
An implementation without a variant's feature gets an "unsupported" row (n/a in
the tables), not a failure: jax.nn.dot_product_attention has no segment ids,
soft cap or dropout; dew_flash_attn's calls take is_causal and window_size (and
the varlen offsets), no mask, bias, key lengths, soft cap or dropout.
--preset features selects the issue's table: bf16, B=4, T=S=4096, N=16, H=128,
--cotangent random, FEATURE_CASES (plain, segments, window, gqa, sinks causal;
plain, kv_lengths, mask, prefix_lm (also with the soft cap), striped_mask, bias,
softcap, dropout not).

Memory (--memory): each row also records fwd_bwd_temp_bytes, XLA's temporary
allocation of the compiled fwd+bwd (memory_analysis(), from a second compile
of it, outside the timing): what a call needs beyond its arguments and
results (the forward's saved out and lse, the backward's dQ accumulator, a
peer's own scratch); results.md tables it per case beside the peers'.

FLOPs count only the query-key pairs the masks leave visible: forward
4*B*N*H*pairs, pairs per (batch, head), backward 2.5x forward. A causal mask
counts the diagonal half, so plain is ../shared/GPU.md's 4*B*N*T*T*H (halved
when causal) exactly and its rows compare with every earlier run; the variants
count exactly otherwise (segments causal: T*T/(2*documents); kv_lengths and
mask: 7/8 of plain's pairs, which earlier runs counted whole). Each row records
visible_fraction = pairs / (T*S).

After the rows, the feature-cost table: per point and variant, each
implementation's TFLOP/s relative to its own plain row at the same point and
causal flag (fwd / bwd; its reciprocal is the time per visible pair relative to
plain's), and jax_flash's TFLOP/s over the best peer's. Writes results.json,
results.md (both tables) and results.png to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash
from jax_flash import benchmark_decode

IMPLEMENTATIONS = ("jax_flash", "cudnn", "xla")
# Also selectable: jax_flash forced onto the sm80 kernels (implementation="sm80"), jax_flash with
# deterministic=True (no dQ atomics in the backward), also forced onto the sm80 kernels, and
# FlashAttention-3 (in the default list when it imports: default_implementations()).
EXTRA_IMPLEMENTATIONS = ("jax_flash_sm80", "jax_flash_deterministic", "jax_flash_deterministic_sm80", "fa3")
# Only in --preset decode (benchmark_decode.py): paged_attention over a block pool.
DECODE_ONLY_IMPLEMENTATIONS = ("jax_flash_paged",)
# What jax_flash is compared with in the feature-cost table.
PEERS = ("cudnn", "xla", "fa3")

VARIANTS = ("plain", "segments", "window", "gqa", "kv_lengths", "mask", "prefix_lm", "prefix_lm_softcap",
            "striped_mask", "bias", "softcap", "dropout", "sinks")
VARIANT_ALIASES = {"key_padding_mask": "mask"}
# The variants each peer runs (jax_flash runs all), and the feature a peer lacks otherwise.
SUPPORTED = {
    "cudnn": ("plain", "window", "gqa", "kv_lengths", "mask", "prefix_lm", "striped_mask", "bias"),
    "xla": ("plain", "window", "gqa", "kv_lengths", "mask", "prefix_lm", "striped_mask", "bias"),
    "fa3": ("plain", "segments", "window", "gqa"),
}
FEATURES = {"segments": "segment ids", "kv_lengths": "key lengths", "mask": "mask", "prefix_lm": "mask",
            "striped_mask": "mask",
            "prefix_lm_softcap": "logits soft cap", "bias": "bias",
            "softcap": "logits soft cap", "dropout": "dropout", "sinks": "attention sinks"}

# The table (--preset features): plain both ways, each feature with the causal flag it is used with.
FEATURE_CASES = (("plain", True), ("segments", True), ("window", True), ("gqa", True), ("sinks", True),
                 ("plain", False), ("kv_lengths", False), ("mask", False), ("prefix_lm", False),
                 ("prefix_lm_softcap", False), ("striped_mask", False), ("bias", False), ("softcap", False),
                 ("dropout", False))
# Values of the options that default to None (so a preset can set them and a flag still wins).
DEFAULTS = {"dtype": "bfloat16", "head_dim": [64, 128, 256], "seqlen": [1024, 4096, 16384],
            "tokens": 16384, "width": 2048, "cotangent": "sum"}
PRESETS = {
    # bf16, B=4, T=S=4096, N=16, H=128, the backward alone.
    "features": {"dtype": "bfloat16", "head_dim": [128], "seqlen": [4096], "tokens": 16384, "width": 2048,
                 "cotangent": "random", "cases": FEATURE_CASES},
    # bf16, B=8, N=32 over K=8 heads, H=128, (Tq, S) of benchmark_decode.DECODE_POINTS; forward only.
    "decode": {"dtype": "bfloat16", "head_dim": [128], "decode_points": benchmark_decode.DECODE_POINTS,
               **benchmark_decode.DECODE_DEFAULTS},
}

# The positional order of a variant's arrays after (q, k, v) in the jitted functions, None where a
# variant has none. The first three are the earlier fixed (bias, mask, kv_lengths), which
# scripts/backward_timing.py still passes.
ARRAY_ROLES = ("bias", "mask", "kv_lengths", "segment_ids", "cu_seqlens", "dropout_rng", "sinks")


@dataclasses.dataclass(frozen=True)
class VariantOptions:
    """The variants' sizes: --documents, --window and --gqa-ratio; the issue's soft cap and dropout rate."""
    documents: int = 4
    window: int = 512
    gqa_ratio: int = 8
    soft_cap: float = 30.0
    dropout_rate: float = 0.1


class Unsupported(Exception):
    """An implementation without a variant's feature, or fa3 that does not import: an n/a row, not a failure."""


def _document_length(seqlen: int, options: VariantOptions) -> int:
    if options.documents < 1 or seqlen % options.documents:
        raise ValueError(f"--documents {options.documents} does not divide T = {seqlen}")
    return seqlen // options.documents


def _valid_keys(seqlen: int) -> int:
    """Keys left by the kv_lengths and mask variants: the last eighth is padding."""
    return seqlen - seqlen // 8


# The striped_mask variant hides key j from query i where (i + j) % STRIPE == 0.
STRIPE = 10


def _prefix_length(seqlen: int) -> int:
    """The prefix_lm variant's bidirectional prefix: the first quarter (at least one key)."""
    return max(1, seqlen // 4)


def kv_heads(variant: str, heads: int, options: VariantOptions) -> int:
    if variant != "gqa":
        return heads
    if options.gqa_ratio < 1 or heads % options.gqa_ratio:
        raise ValueError(f"--gqa-ratio {options.gqa_ratio} does not divide N = {heads}")
    return heads // options.gqa_ratio


def visible_pairs(variant: str, seqlen: int, causal: bool, options: VariantOptions = VariantOptions()) -> float:
    """Query-key pairs one (batch, head) computes at T == S = seqlen: those the variant's masks
    leave visible, a causal mask's diagonal counted half (plain causal: T*T/2, the convention of
    every earlier run). Every query row of every variant sees one interval of keys [lo, hi)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}")
    i = np.arange(seqlen)
    lo = np.zeros(seqlen, np.int64)
    hi = np.full(seqlen, seqlen, np.int64)
    if causal:
        hi = np.minimum(hi, i + 1)
    if variant == "segments":
        length = _document_length(seqlen, options)
        lo = np.maximum(lo, i // length * length)
        hi = np.minimum(hi, (i // length + 1) * length)
    elif variant == "window":
        lo = np.maximum(lo, i - options.window)
        hi = np.minimum(hi, i + 1)
    elif variant in ("kv_lengths", "mask"):
        hi = np.minimum(hi, _valid_keys(seqlen))
    elif variant in ("prefix_lm", "prefix_lm_softcap"):
        hi = np.minimum(hi, np.maximum(i + 1, _prefix_length(seqlen)))
    pairs = np.maximum(hi - lo, 0).astype(np.float64)
    diagonal_visible = (lo <= i) & (i < hi)
    if variant == "striped_mask":
        # Keys j with (i + j) % STRIPE == 0 hidden: those of [lo, hi) are j = r (mod STRIPE), r = -i mod STRIPE.
        r = (-i) % STRIPE
        hidden = np.floor_divide(hi - 1 - r, STRIPE) - np.floor_divide(lo - 1 - r, STRIPE)
        pairs -= np.where(hi > lo, hidden, 0)
        diagonal_visible &= (2 * i) % STRIPE != 0
    if causal:
        pairs -= 0.5 * diagonal_visible
    return float(pairs.sum())


def flops_forward(batch, seqlen, heads, head_dim, causal, variant="plain", options=VariantOptions()) -> float:
    """4 * B * N * H * visible pairs (N the query heads): plain is 4*B*N*T*T*H, halved when causal."""
    return 4.0 * batch * heads * head_dim * visible_pairs(variant, seqlen, causal, options)


def variant_inputs(variant, batch, seqlen, heads, dtype, rng, options=VariantOptions()) -> tuple:
    """A variant's arrays at one point, in ARRAY_ROLES order (None where it has none), made once
    and shared by every implementation."""
    arrays = {}
    if variant == "bias":
        # Made on the device: [1, 16, 4096, 4096] is 256M numbers.
        key = jax.random.key(int(rng.integers(2**31)))
        arrays["bias"] = jax.random.normal(key, (1, heads, seqlen, seqlen), dtype)
    elif variant == "mask":
        valid = np.arange(seqlen) < _valid_keys(seqlen)
        arrays["mask"] = jnp.asarray(np.broadcast_to(valid, (batch, 1, 1, seqlen)))
    elif variant in ("prefix_lm", "prefix_lm_softcap"):
        i = np.arange(seqlen)
        visible = i[None, :] < np.maximum(i + 1, _prefix_length(seqlen))[:, None]
        arrays["mask"] = jnp.asarray(visible[None, None])
    elif variant == "striped_mask":
        i = np.arange(seqlen)
        arrays["mask"] = jnp.asarray(((i[:, None] + i[None, :]) % STRIPE != 0)[None, None])
    elif variant == "kv_lengths":
        arrays["kv_lengths"] = jnp.full((batch,), _valid_keys(seqlen), jnp.int32)
    elif variant == "segments":
        length = _document_length(seqlen, options)
        ids = np.arange(seqlen, dtype=np.int32) // length
        arrays["segment_ids"] = jnp.asarray(np.broadcast_to(ids, (batch, seqlen)))
        # fa3's varlen call: the documents' boundaries in the [B*T] packed tokens.
        arrays["cu_seqlens"] = jnp.asarray(np.arange(0, batch * seqlen + 1, length, dtype=np.int32))
    elif variant == "dropout":
        arrays["dropout_rng"] = jax.random.key(int(rng.integers(2**31)))
    elif variant == "sinks":
        arrays["sinks"] = jnp.asarray(rng.standard_normal(heads), jnp.float32)
    return tuple(arrays.get(role) for role in ARRAY_ROLES)


def _named(extra) -> dict:
    """The positional arrays after (q, k, v) by role; missing trailing ones are None."""
    if len(extra) > len(ARRAY_ROLES):
        raise TypeError(f"at most {len(ARRAY_ROLES)} arrays after q, k, v ({ARRAY_ROLES}); got {len(extra)}")
    return dict(itertools.zip_longest(ARRAY_ROLES, extra))


@functools.cache
def _fa3_import():
    """(dew_flash_attn, None), or (None, why it does not import)."""
    try:
        import dew_flash_attn
    except Exception as e:  # ImportError; OSError when its CUDA library does not load
        return None, f"{type(e).__name__}: {e}"
    return dew_flash_attn, None


def default_implementations() -> list:
    """IMPLEMENTATIONS, and fa3 when it imports and a GPU runs it (dew_flash_attn imports without one)."""
    fa3 = _fa3_import()[0] is not None and jax.default_backend() == "gpu"
    return list(IMPLEMENTATIONS) + (["fa3"] if fa3 else [])


def _attention_fn(impl: str, causal: bool, variant: str = "plain", options: VariantOptions = VariantOptions()):
    """attention(q, k, v, *arrays), arrays in ARRAY_ROLES order (variant_inputs). The arrays are
    arguments of the jitted function, never closed over: a closed-over array becomes an XLA
    constant (512 MiB for the bias variant), slow to compile and run. The variant's numbers
    (window, soft cap, dropout rate) are static. Raises Unsupported when impl lacks the variant."""
    window = (options.window, 0) if variant == "window" else None
    if impl.startswith("jax_flash"):
        soft_cap = options.soft_cap if variant in ("softcap", "prefix_lm_softcap") else None
        rate = options.dropout_rate if variant == "dropout" else 0.0
        deterministic = impl.startswith("jax_flash_deterministic")
        implementation = "sm80" if impl.endswith("_sm80") else None

        def attn(q, k, v, *extra):
            x = _named(extra)
            return jax_flash.attention(
                q, k, v, x["bias"], x["mask"], is_causal=causal, key_value_seq_lengths=x["kv_lengths"],
                local_window_size=window, q_segment_ids=x["segment_ids"], kv_segment_ids=x["segment_ids"],
                logits_soft_cap=soft_cap, dropout_rate=rate, dropout_rng=x["dropout_rng"],
                deterministic=deterministic, implementation=implementation, sinks=x["sinks"],
            )
        return attn
    if variant not in SUPPORTED[impl]:
        raise Unsupported(f"unsupported: {impl} takes no {FEATURES[variant]}")
    if impl == "fa3":
        return _fa3_fn(causal, variant, window, options)

    def attn(q, k, v, *extra):
        x = _named(extra)
        return jax.nn.dot_product_attention(
            q, k, v, x["bias"], x["mask"], is_causal=causal, key_value_seq_lengths=x["kv_lengths"],
            local_window_size=window, implementation=impl,
        )
    return attn


def _fa3_fn(causal, variant, window, options):
    """FlashAttention-3 on [B, T, N, H]: flash_mha, or for packed documents flash_mha_varlen on
    the [B*T, N, H] tokens with the documents' boundaries (cu_seqlens) and longest length."""
    fa3, why = _fa3_import()
    if fa3 is None:
        raise Unsupported(f"fa3 not importable ({why})")
    if variant == "segments":
        def attn(q, k, v, *extra):
            b, t = q.shape[:2]
            q2, k2, v2 = (x.reshape(b * t, *x.shape[2:]) for x in (q, k, v))
            out = fa3.flash_mha_varlen(q2, k2, v2, _named(extra)["cu_seqlens"], _document_length(t, options),
                                       is_causal=causal)
            return out.reshape(q.shape)
        return attn
    window_kwargs = {} if window is None else {"window_size": window}
    return lambda q, k, v, *extra: fa3.flash_mha(q, k, v, is_causal=causal, **window_kwargs)


def calls_per_sample(one_call_s: float, min_sample_s: float, max_calls: int = 100) -> int:
    """Back-to-back calls that make a timing sample last at least min_sample_s."""
    if min_sample_s <= 0 or one_call_s >= min_sample_s:
        return 1
    return min(max_calls, math.ceil(min_sample_s / max(one_call_s, 1e-7)))


def _median_seconds(fn, args, iters: int, min_sample_s: float = 0.0) -> float:
    jax.block_until_ready(fn(*args))  # compile + warm-up
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    calls = calls_per_sample(time.perf_counter() - start, min_sample_s)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        for _ in range(calls - 1):
            fn(*args)  # dispatched asynchronously; the device runs them in order
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


COTANGENTS = ("sum", "random")


def forward_backward_fn(attn, cotangent: str):
    """fn(q, k, v, *arrays, dout) -> (loss, (dq, dk, dv)), the arrays (attn's, after q, k, v)
    not differentiated. cotangent "sum": value_and_grad of sum(attn(...)) in float32, dout
    unused; "random": the VJP of attn applied to dout, loss None."""
    if cotangent == "sum":
        return jax.value_and_grad(
            lambda q, k, v, *rest: jnp.sum(attn(q, k, v, *rest[:-1]).astype(jnp.float32)), (0, 1, 2))
    if cotangent == "random":
        def fn(q, k, v, *rest):
            *extra, dout = rest
            _, vjp = jax.vjp(lambda q, k, v: attn(q, k, v, *extra), q, k, v)
            return None, vjp(dout)
        return fn
    raise ValueError(f"cotangent must be one of {COTANGENTS}, got {cotangent!r}")


def _point_fields(impl, variant, batch, seqlen, heads, head_dim, causal, dtype, cotangent) -> dict:
    return {"impl": impl, "variant": variant, "batch": batch, "seqlen": seqlen, "heads": heads,
            "head_dim": head_dim, "causal": bool(causal), "dtype": jnp.dtype(dtype).name, "cotangent": cotangent}


def bench_point(impl, batch, seqlen, heads, head_dim, causal, dtype, iters, rng, variant="plain",
                extra=None, min_sample_s=0.0, cotangent="sum", options=VariantOptions(), memory=False):
    """Times one implementation at one point; `extra` = the variant's arrays (variant_inputs),
    made here when not given (callers timing several implementations share one); `memory`:
    also fwd_bwd_temp_bytes (temp_bytes). Raises Unsupported, before making any input, when
    impl lacks the variant."""
    attn = _attention_fn(impl, causal, variant, options)
    kv = kv_heads(variant, heads, options)
    q_shape, kv_shape = (batch, seqlen, heads, head_dim), (batch, seqlen, kv, head_dim)
    q, k, v = (jnp.asarray(rng.standard_normal(s), dtype) for s in (q_shape, kv_shape, kv_shape))
    if extra is None:
        extra = variant_inputs(variant, batch, seqlen, heads, dtype, rng, options)
    fwd = jax.jit(attn)
    fwd_bwd = jax.jit(forward_backward_fn(attn, cotangent))
    dout = jnp.asarray(rng.standard_normal(q_shape), dtype) if cotangent == "random" else None
    args = (q, k, v) + tuple(extra)
    t_fwd = _median_seconds(fwd, args, iters, min_sample_s)
    t_total = _median_seconds(fwd_bwd, args + (dout,), iters, min_sample_s)
    t_bwd = max(t_total - t_fwd, 1e-9)
    f = flops_forward(batch, seqlen, heads, head_dim, causal, variant, options)
    row = {
        **_point_fields(impl, variant, batch, seqlen, heads, head_dim, causal, dtype, cotangent),
        "kv_heads": kv, "visible_fraction": visible_pairs(variant, seqlen, causal, options) / seqlen**2,
        "fwd_ms": t_fwd * 1e3, "bwd_ms": t_bwd * 1e3,
        "fwd_tflops": f / t_fwd / 1e12, "bwd_tflops": 2.5 * f / t_bwd / 1e12,
    }
    if memory:
        row["fwd_bwd_temp_bytes"] = temp_bytes(fwd_bwd, args + (dout,))
    return row


def temp_bytes(jitted, args) -> int | None:
    """XLA's temporary allocation of a compiled call: every buffer that is
    neither an argument nor a result (the forward's out and lse held for the
    backward, the backward's dQ accumulator and delta, a peer's own scratch),
    the figure issue 21 compares with FlashAttention-3's. None where the
    backend does not report it."""
    try:
        analysis = jitted.lower(*args).compile().memory_analysis()
        return None if analysis is None else int(analysis.temp_size_in_bytes)
    except Exception:  # a backend without memory analysis
        return None


def run_case(impls, batch, seqlen, heads, head_dim, variant, causal, dtype, iters, rng, min_sample_s,
             cotangent, options=VariantOptions(), memory=False) -> list:
    """A row per implementation at one point and variant, printed as it comes; a failure or a
    missing feature is that row's error, never raised."""
    def error_row(impl, error, **flags):
        return {**_point_fields(impl, variant, batch, seqlen, heads, head_dim, causal, dtype, cotangent),
                "error": error, **flags}

    def message(e):
        return f"{type(e).__name__}: {str(e)[:200]}"

    try:
        extra = variant_inputs(variant, batch, seqlen, heads, dtype, rng, options)
    except Exception as e:  # the variant does not fit the point (--documents not dividing T), or memory
        extra, setup_error = None, message(e)
    rows = []
    for impl in impls:
        if extra is None:
            row = error_row(impl, setup_error)
        else:
            try:
                row = bench_point(impl, batch, seqlen, heads, head_dim, causal, dtype, iters, rng, variant,
                                  extra, min_sample_s, cotangent, options, memory)
            except Unsupported as e:
                row = error_row(impl, str(e), unsupported=True)
            except Exception as e:  # e.g. cudnn on the CPU, xla out of memory
                row = error_row(impl, message(e))
        rows.append(row)
        line = markdown_table([row]).splitlines()[-1]
        print(line + (f"  {row['error']}" if "error" in row else ""), flush=True)
    return rows


def memory_table(rows) -> str:
    """fwd+bwd temporary memory (temp_bytes) per case and implementation, MiB,
    and jax_flash's over the least of the peers' (which in parentheses)."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    by_case = {(r["impl"],) + _case_key(r): r for r in rows}
    lines = ["| variant | causal | B | T | N | H | " + " | ".join(f"{i} MiB" for i in impls)
             + " | jax_flash / least peer |",
             "|" + "---|" * (7 + len(impls))]
    for case in dict.fromkeys(_case_key(r) for r in rows):
        batch, seqlen, heads, head_dim, variant, causal = case
        temp = {}
        for impl in impls:
            r = by_case.get((impl,) + case)
            if r is not None and r.get("fwd_bwd_temp_bytes") is not None:
                temp[impl] = r["fwd_bwd_temp_bytes"]
        cells = [f"{temp[i] / 2**20:.1f}" if i in temp else "-" for i in impls]
        peers = [p for p in PEERS if p in temp]
        if "jax_flash" in temp and peers:
            least = min(peers, key=temp.get)
            cells.append(f"{temp['jax_flash'] / max(temp[least], 1):.2f} ({least})")
        else:
            cells.append("-")
        lines.append(f"| {variant} | {int(causal)} | {batch} | {seqlen} | {heads} | {head_dim} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def _error_cell(row) -> str:
    return "n/a" if row.get("unsupported") else "err"


def markdown_table(rows) -> str:
    lines = [
        "| impl | variant | B | T | N | H | causal | visible | fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        visible = f"{r['visible_fraction']:.3f}" if "visible_fraction" in r else ""
        head = (f"| {r['impl']} | {r.get('variant', 'plain')} | {r['batch']} | {r['seqlen']} "
                f"| {r['heads']} | {r['head_dim']} | {int(r['causal'])} | {visible} ")
        if "error" in r:
            cell = _error_cell(r)
            lines.append(head + f"| {cell} | {cell} | | |")
        else:
            lines.append(head + f"| {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} "
                         f"| {r['fwd_tflops']:.1f} | {r['bwd_tflops']:.1f} |")
    return "\n".join(lines)


def _case_key(r) -> tuple:
    """A point, variant and causal flag: rows of one case differ only by implementation."""
    return (r["batch"], r["seqlen"], r["heads"], r["head_dim"], r.get("variant", "plain"), bool(r["causal"]))


def _plain_key(r) -> tuple:
    """The case of r's implementation's plain row: same point, same causal flag."""
    return (r["impl"],) + _case_key(r)[:4] + ("plain", bool(r["causal"]))


def feature_costs(rows) -> list:
    """Every timed non-plain row against its implementation's plain row at the same point and
    causal flag: {fwd,bwd}_vs_plain = variant TFLOP/s / plain TFLOP/s over visible pairs, and
    {fwd,bwd}_cost = its reciprocal, (t_variant / t_plain) / (pairs_variant / pairs_plain), the
    time per visible pair relative to plain's. Rows without a timed plain row have no entry."""
    plain = {(r["impl"],) + _case_key(r): r for r in rows
             if "error" not in r and r.get("variant", "plain") == "plain"}
    costs = []
    for r in rows:
        base = plain.get(_plain_key(r))
        if "error" in r or r.get("variant", "plain") == "plain" or base is None:
            continue
        entry = {k: r[k] for k in ("impl", "variant", "batch", "seqlen", "heads", "head_dim", "causal",
                                   "visible_fraction")}
        for d in ("fwd", "bwd"):
            ratio = r[f"{d}_tflops"] / base[f"{d}_tflops"]
            entry[f"{d}_vs_plain"], entry[f"{d}_cost"] = ratio, 1.0 / ratio
        costs.append(entry)
    return costs


FEATURE_TABLE_NOTE = (
    "Per implementation, TFLOP/s over visible pairs relative to its own plain row at the\n"
    "same point and causal flag, fwd / bwd (1/x: the time per visible pair relative to plain's); base: the\n"
    "plain row itself; n/a: the implementation lacks the feature; -: not run, or no plain row to compare.\n"
    "Last columns: jax_flash's TFLOP/s over the best peer's (which in parentheses).")


MEMORY_TABLE_NOTE = (
    "XLA's temporary allocation of each implementation's compiled fwd+bwd (memory_analysis():\n"
    "neither arguments nor results; the saved out / lse, scratch such as the dQ accumulator), in MiB.")


def feature_table(rows) -> str:
    """The feature-cost table (FEATURE_TABLE_NOTE), one line per point, variant and causal flag."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    cases = list(dict.fromkeys(_case_key(r) for r in rows))
    by_case = {(r["impl"],) + _case_key(r): r for r in rows}
    costs = {(c["impl"],) + _case_key(c): c for c in feature_costs(rows)}
    lines = ["| variant | causal | B | T | N | H | visible | " + " | ".join(f"{i} fwd / bwd" for i in impls)
             + " | jax_flash / best peer fwd | bwd |",
             "|" + "---|" * (9 + len(impls))]
    for case in cases:
        batch, seqlen, heads, head_dim, variant, causal = case
        here = {impl: by_case.get((impl,) + case) for impl in impls}
        ok = {impl: r for impl, r in here.items() if r is not None and "error" not in r}
        visible = next((f"{r['visible_fraction']:.3f}" for r in ok.values()), "-")
        cells = []
        for impl in impls:
            r, c = here[impl], costs.get((impl,) + case)
            if r is None:
                cells.append("-")
            elif "error" in r:
                cells.append(_error_cell(r))
            elif variant == "plain":
                cells.append("base")
            else:
                cells.append(f"{c['fwd_vs_plain']:.2f} / {c['bwd_vs_plain']:.2f}" if c else "-")
        peers = [ok[p] for p in PEERS if p in ok]
        for d in ("fwd", "bwd"):
            if "jax_flash" in ok and peers:
                best = max(peers, key=lambda r: r[f"{d}_tflops"])
                cells.append(f"{ok['jax_flash'][f'{d}_tflops'] / best[f'{d}_tflops']:.2f} ({best['impl']})")
            else:
                cells.append("-")
        lines.append(f"| {variant} | {int(causal)} | {batch} | {seqlen} | {heads} | {head_dim} | {visible} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def long_sequence_memory(seqlen, heads, head_dim, dtype, rng) -> dict:
    """fwd+bwd of jax_flash at B=1 and a long sequence: time and peak device memory.

    A T x T buffer anywhere would need T*T*N*4 bytes (1 TiB at 128k, N=16);
    completing proves there is none. Peak memory comes from the device's
    allocator statistics (GPU only; None on the CPU).
    """
    shape = (1, seqlen, heads, head_dim)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(3))
    step = jax.jit(jax.grad(
        lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v, is_causal=True).astype(jnp.float32)),
        (0, 1, 2)))
    start = time.perf_counter()
    grads = jax.block_until_ready(step(q, k, v))
    seconds = time.perf_counter() - start
    stats = jax.devices()[0].memory_stats() or {}
    return {"seqlen": seqlen, "heads": heads, "head_dim": head_dim, "dtype": jnp.dtype(dtype).name,
            "fwd_bwd_s_incl_compile": seconds,
            "grads_finite": all(bool(jnp.all(jnp.isfinite(g))) for g in grads),
            "peak_bytes": stats.get("peak_bytes_in_use"),
            "inputs_outputs_grads_bytes": 7 * q.size * q.dtype.itemsize}


def write_chart(rows, path) -> bool:
    """Bar chart of forward/backward TFLOP/s per point and implementation (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ok = [r for r in rows if "error" not in r and r.get("variant", "plain") == "plain"]
    points = sorted({(r["head_dim"], r["seqlen"], r["causal"]) for r in ok})
    impls = sorted({r["impl"] for r in ok})
    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(points) * 0.9), 7), sharex=True)
    width = 0.8 / max(1, len(impls))
    for ax, key in zip(axes, ("fwd_tflops", "bwd_tflops")):
        for i, impl in enumerate(impls):
            by_point = {(r["head_dim"], r["seqlen"], r["causal"]): r[key] for r in ok if r["impl"] == impl}
            ax.bar([j + i * width for j in range(len(points))],
                   [by_point.get(pt, 0.0) for pt in points], width, label=impl)
        ax.set_ylabel(key.replace("_tflops", " TFLOP/s"))
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    axes[1].set_xticks([j + 0.4 - width / 2 for j in range(len(points))])
    axes[1].set_xticklabels([f"H{h}\nT{t}\n{'causal' if c else 'full'}" for h, t, c in points], fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def _variant(name: str) -> str:
    return VARIANT_ALIASES.get(name, name)


def _case(text: str) -> tuple:
    """VARIANT:CAUSAL (e.g. segments:1) -> (variant, causal)."""
    variant, _, causal = text.rpartition(":")
    variant = _variant(variant)
    if variant not in VARIANTS or causal not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"expected VARIANT:0 or VARIANT:1, VARIANT one of {', '.join(VARIANTS)}; "
                                         f"got {text!r}")
    return variant, causal == "1"


def _resolve(parser, args):
    """Fills the options left unset from --preset, then DEFAULTS, and sets args.cases: --cases;
    else --variant x --causal (either given); else the preset's cases; else plain, causal 0 and 1."""
    preset = PRESETS.get(args.preset, {})
    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, preset.get(name, default))
    if args.ragged_points and args.preset != "decode":
        parser.error("--ragged-points runs only in --preset decode")
    if any(tq != 1 for tq, _ in args.ragged_points or ()):
        parser.error("--ragged-points takes Tq = 1 (1:S): the contiguous calls have no per-sequence "
                     "bottom-right alignment")
    if args.preset == "decode":
        for name in ("decode_points", *benchmark_decode.DECODE_DEFAULTS):
            if getattr(args, name) is None:
                setattr(args, name, preset[name])
        if args.impl is None:
            fa3 = ["fa3"] if "fa3" in default_implementations() else []
            args.impl = list(benchmark_decode.DECODE_IMPLEMENTATIONS) + fa3
        return args
    if args.impl is None:
        args.impl = default_implementations()
    decode_only = [i for i in args.impl if i in DECODE_ONLY_IMPLEMENTATIONS]
    if decode_only:
        parser.error(f"--impl {' '.join(decode_only)} runs only in --preset decode")
    if args.cases is not None and (args.variant is not None or args.causal is not None):
        parser.error("--cases replaces --variant and --causal: give one or the other")
    if args.cases is None:
        if args.variant is None and args.causal is None and "cases" in preset:
            args.cases = list(preset["cases"])
        else:
            args.cases = [(variant, bool(causal)) for causal in (args.causal or [0, 1])
                          for variant in (args.variant or ["plain"])]
    return args


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="features: the issue's table, bf16, B=4, T=S=4096, N=16, H=128, --cotangent "
                             "random, cases " + " ".join(f"{v}:{int(c)}" for v, c in FEATURE_CASES)
                             + "; decode: forward latency of Tq new tokens over S cached ones, bf16, B=8, "
                             "N=32, K=8, H=128, --decode-points " + " ".join(f"{t}:{s}" for t, s in
                                                                         benchmark_decode.DECODE_POINTS)
                             + " (jax_flash/benchmark_decode.py); explicit options still win")
    parser.add_argument("--impl", nargs="+",
                        choices=IMPLEMENTATIONS + EXTRA_IMPLEMENTATIONS + DECODE_ONLY_IMPLEMENTATIONS,
                        help="default: " + " ".join(IMPLEMENTATIONS) + ", and fa3 when dew_flash_attn imports "
                             "(--preset decode: " + " ".join(benchmark_decode.DECODE_IMPLEMENTATIONS) + " and fa3)")
    parser.add_argument("--head-dim", nargs="+", type=int, help=f"default {DEFAULTS['head_dim']}")
    parser.add_argument("--seqlen", nargs="+", type=int, help=f"default {DEFAULTS['seqlen']}")
    parser.add_argument("--tokens", type=int, help=f"B = tokens / T (default {DEFAULTS['tokens']})")
    parser.add_argument("--width", type=int, help=f"N = width / H (default {DEFAULTS['width']})")
    parser.add_argument("--causal", nargs="+", type=int, choices=[0, 1], help="default 0 1")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="default bfloat16")
    parser.add_argument("--iters", type=int, default=10, help="timing samples per point (median)")
    parser.add_argument("--min-sample-ms", type=float, default=100.0,
                        help="back-to-back calls per sample until it lasts this long (0: one "
                             "blocked call per sample, which also counts host dispatch latency)")
    parser.add_argument("--variant", nargs="+", type=_variant, choices=VARIANTS,
                        help="default plain; each with every --causal (key_padding_mask = mask); the "
                             "module docstring above says what each is")
    parser.add_argument("--cases", nargs="+", type=_case, metavar="VARIANT:CAUSAL",
                        help="instead of --variant x --causal: a causal flag per variant, e.g. plain:1 segments:1")
    parser.add_argument("--documents", type=int, default=4, help="segments: documents per row (T/documents each)")
    parser.add_argument("--window", type=int, default=512, help="window: keys a query sees back")
    parser.add_argument("--gqa-ratio", type=int, default=8, help="gqa: query heads per key/value head")
    parser.add_argument("--cotangent", choices=COTANGENTS,
                        help="backward timed from value_and_grad of sum(attention) (sum, the default) or as "
                             "the VJP of a given random dO (random: the backward alone)")
    parser.add_argument("--memory", action="store_true",
                        help="also record each implementation's fwd+bwd temporary allocation "
                             "(XLA's memory analysis, one more compile per row) and table it")
    parser.add_argument("--long-seqlen", type=int, default=0,
                        help="also run jax_flash fwd+bwd at B=1, N=16, H=128 and this length "
                             "(131072 for the 128k check), reporting peak device memory")
    decode = parser.add_argument_group("--preset decode")
    decode.add_argument("--decode-points", nargs="+", type=benchmark_decode.point, metavar="TQ:S",
                        help="new tokens : cached tokens per sequence")
    decode.add_argument("--ragged-points", nargs="+", type=benchmark_decode.point, metavar="1:S",
                        help="points whose B sequences have lengths spread over 1..S (Tq = 1; "
                             "e.g. 1:32768); after --decode-points")
    decode.add_argument("--batch", type=int, help=f"B (default {benchmark_decode.DECODE_DEFAULTS['batch']})")
    decode.add_argument("--heads", type=int, help=f"N (default {benchmark_decode.DECODE_DEFAULTS['heads']})")
    decode.add_argument("--kv-heads", type=int, help=f"K (default {benchmark_decode.DECODE_DEFAULTS['kv_heads']})")
    decode.add_argument("--block-size", type=int, nargs="+",
                        help="jax_flash_paged's pool block sizes, a row each (default "
                             + " ".join(map(str, benchmark_decode.DECODE_DEFAULTS["block_size"])) + ")")
    parser.add_argument("--out", default="bench_out", help="directory for results.json and results.md")
    return parser


def main(argv=None):
    parser = _parser()
    args = _resolve(parser, parser.parse_args(argv))
    if args.preset == "decode":
        return decode_main(args)
    options = VariantOptions(documents=args.documents, window=args.window, gqa_ratio=args.gqa_ratio)

    rng = np.random.default_rng(0)
    fa3, why = _fa3_import()
    fa3_info = "importable" if fa3 else f"not importable ({why})"
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; jax_flash {jax_flash.build_info()}; "
          f"fa3 {fa3_info}")
    rows = []
    for head_dim in args.head_dim:
        for seqlen in args.seqlen:
            batch, heads = max(1, args.tokens // seqlen), max(1, args.width // head_dim)
            for variant, causal in args.cases:
                rows += run_case(args.impl, batch, seqlen, heads, head_dim, variant, causal, args.dtype,
                                 args.iters, rng, args.min_sample_ms / 1e3, args.cotangent, options,
                                 args.memory)
    long_run = None
    if args.long_seqlen:
        long_run = long_sequence_memory(args.long_seqlen, 16, 128, args.dtype, rng)
        print("long sequence:", long_run, flush=True)
    os.makedirs(args.out, exist_ok=True)
    meta = {"jax": jax.__version__, "device": jax.devices()[0].device_kind,
            "build": jax_flash.build_info(), "fa3": fa3_info, "iters": args.iters,
            "min_sample_ms": args.min_sample_ms, "cotangent": args.cotangent, "preset": args.preset,
            "cases": [[v, int(c)] for v, c in args.cases], "options": dataclasses.asdict(options)}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "feature_cost": feature_costs(rows), "long_sequence": long_run},
                  f, indent=1)
    write_chart(rows, os.path.join(args.out, "results.png"))
    text = f"{markdown_table(rows)}\n\n## Feature cost\n\n{FEATURE_TABLE_NOTE}\n\n{feature_table(rows)}"
    if args.memory:
        text += f"\n\n## Temporary memory, fwd+bwd\n\n{MEMORY_TABLE_NOTE}\n\n{memory_table(rows)}"
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text + "\n")
    print(text)


def decode_main(args):
    """--preset decode: benchmark_decode's rows at every head dim and (Tq, S); results.json
    (meta, rows) and results.md (the decode table)."""
    fa3, why = _fa3_import()
    fa3_info = "importable" if fa3 else f"not importable ({why})"
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; jax_flash {jax_flash.build_info()}; "
          f"fa3 {fa3_info}")
    dtype = jnp.dtype(args.dtype)
    rows = []
    for head_dim in args.head_dim:
        points = [(p, False) for p in args.decode_points] + [(p, True) for p in args.ragged_points or ()]
        for seed, ((tq, seqlen), ragged) in enumerate(points):
            rows += benchmark_decode.run_point(
                args.impl, args.batch, tq, seqlen, args.heads, args.kv_heads, head_dim, dtype, args.block_size,
                args.iters, args.min_sample_ms / 1e3, seed, _median_seconds, _fa3_import, ragged)
    os.makedirs(args.out, exist_ok=True)
    meta = {"jax": jax.__version__, "device": jax.devices()[0].device_kind, "build": jax_flash.build_info(),
            "fa3": fa3_info, "iters": args.iters, "min_sample_ms": args.min_sample_ms, "preset": "decode",
            "copy_bytes_per_s": benchmark_decode.COPY_BYTES_PER_S, "block_size": args.block_size,
            "decode_points": [list(p) for p in args.decode_points],
            "ragged_points": [list(p) for p in args.ragged_points or ()]}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    text = f"## Decode\n\n{benchmark_decode.DECODE_TABLE_NOTE}\n\n{benchmark_decode.decode_table(rows)}"
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return rows


if __name__ == "__main__":
    main()
