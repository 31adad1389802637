"""How the harness's backward time depends on how it is sampled.

The harness reports backward = (fwd + bwd) - fwd, each the median of samples
of back-to-back calls lasting at least --min-sample-ms (5 ms through v13,
100 ms since). A fwd + bwd call longer than the floor is one blocked call per
sample, while a shorter forward is several: the difference then carries the
per-sample dispatch and wait, which no kernel has. This times, per shape and implementation, in one process:
  fwd and fwd+bwd with samples of >= 5 ms and of >= 100 ms (the harness's
  method at both), and the backward alone: jit(vjp_fn)(dO) with the forward's
  residuals made once beforehand (no subtraction).

    python3 scripts/backward_timing.py --shape 4,4096,16,128 1,16384,16,128 [--causal 0 1]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash import benchmark as bm


FLOORS_S = (0.005, 0.1)  # sample floors compared: v13's and v14's


def time_point(impl: str, b: int, t: int, n: int, h: int, causal: bool, iters: int, rng,
               floors=None) -> dict:
    """ms: ("fwd", floor), ("tot", floor) and ("bwd", floor) = tot - fwd for each floor (seconds;
    FLOORS_S by default), and "alone": the backward by itself, jit(vjp_fn)(dO), with samples of
    the last floor."""
    floors = floors or FLOORS_S
    q, k, v, dout = (jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.bfloat16) for _ in range(4))
    extra = (None, None, None)
    attn = bm._attention_fn(impl, causal)
    fwd = jax.jit(attn)
    fwd_bwd = jax.jit(bm.forward_backward_fn(attn, "random"))
    _, vjp_fn = jax.vjp(lambda q, k, v: attn(q, k, v, *extra), q, k, v)
    bwd_alone = jax.jit(lambda f, d: f(d))
    ms = {}
    for floor in floors:
        ms["fwd", floor] = 1e3 * bm._median_seconds(fwd, (q, k, v) + extra, iters, floor)
        ms["tot", floor] = 1e3 * bm._median_seconds(fwd_bwd, (q, k, v) + extra + (dout,), iters, floor)
        ms["bwd", floor] = ms["tot", floor] - ms["fwd", floor]
    ms["alone"] = 1e3 * bm._median_seconds(bwd_alone, (vjp_fn, dout), iters, floors[-1])
    return ms


def header(floors=None) -> str:
    lo, hi = (f"{1e3 * f:g} ms" for f in (floors or FLOORS_S))
    return (f"| impl | B,T,N,H | causal | fwd {lo} | fwd {hi} | fwd+bwd {lo} | fwd+bwd {hi} "
            f"| bwd {lo} | bwd {hi} | bwd alone {hi} | bwd TFLOP/s ({lo} / {hi} / alone) |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|")


def table_row(impl: str, shape: str, causal: int, ms: dict, floors=None) -> str:
    b, t, n, h = map(int, shape.split(","))
    lo, hi = floors or FLOORS_S
    gflop = 2.5 * bm.flops_forward(b, t, n, h, bool(causal)) / 1e9  # GFLOP / ms = TFLOP/s
    return (f"| {impl} | {shape} | {causal} | {ms['fwd', lo]:.3f} | {ms['fwd', hi]:.3f} "
            f"| {ms['tot', lo]:.3f} | {ms['tot', hi]:.3f} | {ms['bwd', lo]:.3f} | {ms['bwd', hi]:.3f} "
            f"| {ms['alone']:.3f} | {gflop / ms['bwd', lo]:.0f} / {gflop / ms['bwd', hi]:.0f} "
            f"/ {gflop / ms['alone']:.0f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", nargs="+", default=["4,4096,16,128"], help="B,T,N,H")
    parser.add_argument("--causal", nargs="+", type=int, default=[0])
    parser.add_argument("--impl", nargs="+", default=["jax_flash", "cudnn"])
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print(header())
    for shape in args.shape:
        b, t, n, h = map(int, shape.split(","))
        for causal in args.causal:
            for impl in args.impl:
                ms = time_point(impl, b, t, n, h, bool(causal), args.iters, rng)
                print(table_row(impl, shape, causal, ms), flush=True)


if __name__ == "__main__":
    main()
