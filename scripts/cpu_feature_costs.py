"""What the soft cap, dropout and packed documents cost on the CPU path.

    python scripts/cpu_feature_costs.py [--seqlen 2048 --heads 4 --head-dim 64 --iters 7]

Times a jitted float32 forward + backward (value_and_grad of the output's sum
w.r.t. q, k, v) at B=1 on the CPU and prints each variant's median wall time
and CPU time (this process's threads, all of them) with its ratio to its
baseline: logits_soft_cap=30 and dropout_rate=0.1 against the plain
non-causal call; 4 packed documents per row (segment ids
arange(T) // (T // 4)), causal, against the plain causal call. Every variant
is compiled and run once, then the variants take turns, --iters rounds of
one timed run each, so a drift in the machine's speed (a shared or throttled
host) hits them all alike. Keep the machine otherwise idle: the ratios, not
the absolute times, are what carry over between machines.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash


def seconds(fn, args):
    """(wall, CPU) seconds of one blocked call; CPU time counts all threads."""
    wall, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - wall, time.process_time() - cpu


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlen", type=int, default=2048)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--iters", type=int, default=7)
    args = p.parse_args()
    jax.config.update("jax_platforms", "cpu")
    t = args.seqlen
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, t, args.heads, args.head_dim)), jnp.float32)
               for _ in range(3))
    docs = jnp.asarray(np.arange(t) // (t // 4), jnp.int32)[None]
    variants = {  # name: (attention kwargs, baseline name)
        "plain": (dict(), None),
        "softcap": (dict(logits_soft_cap=30.0), "plain"),
        "dropout": (dict(dropout_rate=0.1, dropout_rng=jax.random.key(0)), "plain"),
        "causal": (dict(is_causal=True), None),
        "packed": (dict(is_causal=True, q_segment_ids=docs, kv_segment_ids=docs), "causal"),
    }
    steps = {}
    for name, (kwargs, _) in variants.items():
        loss = lambda q, k, v, kw=kwargs: jnp.sum(jax_flash.attention(q, k, v, **kw))
        steps[name] = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))
        seconds(steps[name], (q, k, v))  # compile and warm up
    times = {name: [] for name in variants}
    for _ in range(args.iters):
        for name, step in steps.items():
            times[name].append(seconds(step, (q, k, v)))
    print(f"{'':8s} {'wall':>9s} {'ratio':>6s} {'cpu':>9s} {'ratio':>6s}")
    for name, (_, base) in variants.items():
        line = f"{name:8s}"
        for kind in (0, 1):  # wall, CPU
            med = lambda n: statistics.median(ts[kind] for ts in times[n])
            ratio = f"{med(name) / med(base):5.2f}x" if base else "     -"
            line += f" {med(name) * 1e3:6.1f} ms {ratio}"
        print(line + (f"  vs {base}" if base else ""))


if __name__ == "__main__":
    main()
