"""Times jax_flash beside jax.nn.dot_product_attention in one process.

    python -m jax_flash.benchmark --help

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
41 us at B*N*T*H = 33.5M on the H200, in docs/PERF.md's v10 kernel timeline;
the reduction not timed apart); or `random`, the VJP of attention applied to a given
random dO, the backward alone, as FlashAttention's benchmark and PyTorch's
`out.backward(dout)` time it.
FLOPs as in ../shared/GPU.md: forward 4*B*N*Tq*Tk*H (halved when causal),
backward 2.5x forward. Writes JSON and a markdown table to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash

IMPLEMENTATIONS = ("jax_flash", "cudnn", "xla")
# Also selectable: jax_flash with deterministic=True (no dQ atomics in the backward).
EXTRA_IMPLEMENTATIONS = ("jax_flash_deterministic",)


VARIANTS = ("plain", "bias", "key_padding_mask", "kv_lengths")


def _extra_args(variant: str, batch, seqlen, heads, rng):
    """Positional (bias, mask, key_value_seq_lengths) for a variant: a full [B, N, T, S]
    float32 bias; a [B, 1, 1, S] key-padding mask hiding the last eighth of each
    sequence; or the same padding as per-batch key lengths (which jax's cuDNN path
    takes, unlike that mask)."""
    if variant == "bias":
        # float32 straight from the generator: [4, 16, 4096, 4096] is 4 GiB already.
        return (jnp.asarray(rng.standard_normal((batch, heads, seqlen, seqlen), dtype=np.float32)), None, None)
    if variant == "key_padding_mask":
        valid = np.arange(seqlen) < seqlen - seqlen // 8
        return (None, jnp.asarray(np.broadcast_to(valid, (batch, 1, 1, seqlen))), None)
    if variant == "kv_lengths":
        return (None, None, jnp.full((batch,), seqlen - seqlen // 8, jnp.int32))
    return (None, None, None)


def _attention_fn(impl: str, causal: bool):
    """attention(q, k, v, bias, mask, kv_lengths). The bias, mask and lengths are
    arguments of the jitted function, never closed over: a closed-over array
    becomes an XLA constant (4 GiB for the bias variant), which is slow to
    compile and run."""
    if impl.startswith("jax_flash"):
        deterministic = impl == "jax_flash_deterministic"
        return lambda q, k, v, bias, mask, kv_lengths: jax_flash.attention(
            q, k, v, bias, mask, is_causal=causal, key_value_seq_lengths=kv_lengths,
            deterministic=deterministic,
        )
    return lambda q, k, v, bias, mask, kv_lengths: jax.nn.dot_product_attention(
        q, k, v, bias, mask, is_causal=causal, key_value_seq_lengths=kv_lengths,
        implementation=impl,
    )


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


def flops_forward(batch, seqlen, heads, head_dim, causal) -> float:
    f = 4.0 * batch * heads * seqlen * seqlen * head_dim
    return f / 2 if causal else f


COTANGENTS = ("sum", "random")


def forward_backward_fn(attn, cotangent: str):
    """fn(q, k, v, bias, mask, kv_lengths, dout) -> (loss, (dq, dk, dv)), the bias not
    differentiated. cotangent "sum": value_and_grad of sum(attn(...)) in float32, dout
    unused; "random": the VJP of attn applied to dout, loss None."""
    if cotangent == "sum":
        return jax.value_and_grad(
            lambda q, k, v, bias, mask, kv_lengths, dout: jnp.sum(
                attn(q, k, v, bias, mask, kv_lengths).astype(jnp.float32)), (0, 1, 2))
    if cotangent == "random":
        def fn(q, k, v, bias, mask, kv_lengths, dout):
            _, vjp = jax.vjp(lambda q, k, v: attn(q, k, v, bias, mask, kv_lengths), q, k, v)
            return None, vjp(dout)
        return fn
    raise ValueError(f"cotangent must be one of {COTANGENTS}, got {cotangent!r}")


def bench_point(impl, batch, seqlen, heads, head_dim, causal, dtype, iters, rng, variant="plain",
                extra=None, min_sample_s=0.0, cotangent="sum"):
    """Times one implementation at one point; `extra` = the variant's (bias, mask, kv_lengths),
    made here when not given (callers timing several implementations share one)."""
    shape = (batch, seqlen, heads, head_dim)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(3))
    if extra is None:
        extra = _extra_args(variant, batch, seqlen, heads, rng)
    attn = _attention_fn(impl, causal)
    fwd = jax.jit(attn)
    fwd_bwd = jax.jit(forward_backward_fn(attn, cotangent))
    dout = jnp.asarray(rng.standard_normal(shape), dtype) if cotangent == "random" else None
    args = (q, k, v) + tuple(extra)
    t_fwd = _median_seconds(fwd, args, iters, min_sample_s)
    t_total = _median_seconds(fwd_bwd, args + (dout,), iters, min_sample_s)
    t_bwd = max(t_total - t_fwd, 1e-9)
    f = flops_forward(batch, seqlen, heads, head_dim, causal)
    return {
        "impl": impl, "variant": variant, "batch": batch, "seqlen": seqlen, "heads": heads,
        "head_dim": head_dim, "causal": causal, "dtype": jnp.dtype(dtype).name, "cotangent": cotangent,
        "fwd_ms": t_fwd * 1e3, "bwd_ms": t_bwd * 1e3,
        "fwd_tflops": f / t_fwd / 1e12, "bwd_tflops": 2.5 * f / t_bwd / 1e12,
    }


def markdown_table(rows) -> str:
    lines = [
        "| impl | variant | B | T | N | H | causal | fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        head = (f"| {r['impl']} | {r.get('variant', 'plain')} | {r['batch']} | {r['seqlen']} "
                f"| {r['heads']} | {r['head_dim']} | {int(r['causal'])} ")
        if "error" in r:
            lines.append(head + "| err | err | | |")
        else:
            lines.append(head + f"| {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} "
                         f"| {r['fwd_tflops']:.1f} | {r['bwd_tflops']:.1f} |")
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", nargs="+", default=list(IMPLEMENTATIONS),
                        choices=IMPLEMENTATIONS + EXTRA_IMPLEMENTATIONS)
    parser.add_argument("--head-dim", nargs="+", type=int, default=[64, 128, 256])
    parser.add_argument("--seqlen", nargs="+", type=int, default=[1024, 4096, 16384])
    parser.add_argument("--tokens", type=int, default=16384, help="B = tokens / T")
    parser.add_argument("--width", type=int, default=2048, help="N = width / H")
    parser.add_argument("--causal", nargs="+", type=int, default=[0, 1], choices=[0, 1])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--iters", type=int, default=10, help="timing samples per point (median)")
    parser.add_argument("--min-sample-ms", type=float, default=100.0,
                        help="back-to-back calls per sample until it lasts this long (0: one "
                             "blocked call per sample, which also counts host dispatch latency)")
    parser.add_argument("--variant", nargs="+", default=["plain"], choices=VARIANTS,
                        help="plain; with a full float32 bias; with a [B,1,1,S] key-padding mask; "
                             "or with the same padding as key_value_seq_lengths")
    parser.add_argument("--cotangent", default="sum", choices=COTANGENTS,
                        help="backward timed from value_and_grad of sum(attention) (sum) or as the "
                             "VJP of a given random dO (random: the backward alone)")
    parser.add_argument("--long-seqlen", type=int, default=0,
                        help="also run jax_flash fwd+bwd at B=1, N=16, H=128 and this length "
                             "(131072 for the 128k check), reporting peak device memory")
    parser.add_argument("--out", default="bench_out", help="directory for results.json and results.md")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    rows = []
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; jax_flash {jax_flash.build_info()}")
    for head_dim in args.head_dim:
        for seqlen in args.seqlen:
            for causal in args.causal:
                batch, heads = max(1, args.tokens // seqlen), max(1, args.width // head_dim)
                for variant in args.variant:
                    extra = _extra_args(variant, batch, seqlen, heads, rng)
                    for impl in args.impl:
                        try:
                            row = bench_point(impl, batch, seqlen, heads, head_dim, bool(causal),
                                              args.dtype, args.iters, rng, variant, extra,
                                              args.min_sample_ms / 1e3, args.cotangent)
                        except Exception as e:  # e.g. cudnn on the CPU, xla out of memory
                            row = {"impl": impl, "variant": variant, "batch": batch, "seqlen": seqlen,
                                   "heads": heads, "head_dim": head_dim, "causal": bool(causal),
                                   "dtype": args.dtype, "error": f"{type(e).__name__}: {str(e)[:200]}"}
                        rows.append(row)
                        print(markdown_table([row]).splitlines()[-1], flush=True)
    long_run = None
    if args.long_seqlen:
        long_run = long_sequence_memory(args.long_seqlen, 16, 128, args.dtype, rng)
        print("long sequence:", long_run, flush=True)
    os.makedirs(args.out, exist_ok=True)
    meta = {"jax": jax.__version__, "device": jax.devices()[0].device_kind,
            "build": jax_flash.build_info(), "iters": args.iters,
            "min_sample_ms": args.min_sample_ms, "cotangent": args.cotangent}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "long_sequence": long_run}, f, indent=1)
    write_chart(rows, os.path.join(args.out, "results.png"))
    table = markdown_table(rows)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
