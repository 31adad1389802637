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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", nargs="+", default=["4,4096,16,128"], help="B,T,N,H")
    parser.add_argument("--causal", nargs="+", type=int, default=[0])
    parser.add_argument("--impl", nargs="+", default=["jax_flash", "cudnn"])
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| impl | B,T,N,H | causal | fwd 5 ms | fwd 100 ms | fwd+bwd 5 ms | fwd+bwd 100 ms "
          "| bwd 5 ms | bwd 100 ms | bwd alone 100 ms | bwd TFLOP/s (5 / 100 / alone) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in args.shape:
        b, t, n, h = map(int, shape.split(","))
        for causal in args.causal:
            q, k, v, dout = (jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.bfloat16) for _ in range(4))
            extra = (None, None, None)
            for impl in args.impl:
                attn = bm._attention_fn(impl, bool(causal))
                fwd = jax.jit(attn)
                fwd_bwd = jax.jit(bm.forward_backward_fn(attn, "random"))
                _, vjp_fn = jax.vjp(lambda q, k, v: attn(q, k, v, *extra), q, k, v)
                bwd_alone = jax.jit(lambda f, d: f(d))
                ms = {}
                for sample in (0.005, 0.1):
                    ms["fwd", sample] = 1e3 * bm._median_seconds(fwd, (q, k, v) + extra, args.iters, sample)
                    ms["tot", sample] = 1e3 * bm._median_seconds(fwd_bwd, (q, k, v) + extra + (dout,),
                                                                 args.iters, sample)
                alone = 1e3 * bm._median_seconds(bwd_alone, (vjp_fn, dout), args.iters, 0.1)
                bwd5, bwd100 = ms["tot", 0.005] - ms["fwd", 0.005], ms["tot", 0.1] - ms["fwd", 0.1]
                flop = 2.5 * bm.flops_forward(b, t, n, h, bool(causal)) / 1e9  # GFLOP -> TFLOP/s per ms
                print(f"| {impl} | {shape} | {causal} | {ms['fwd', 0.005]:.3f} | {ms['fwd', 0.1]:.3f} "
                      f"| {ms['tot', 0.005]:.3f} | {ms['tot', 0.1]:.3f} | {bwd5:.3f} | {bwd100:.3f} "
                      f"| {alone:.3f} | {flop / bwd5:.0f} / {flop / bwd100:.0f} / {flop / alone:.0f} |",
                      flush=True)


if __name__ == "__main__":
    main()
