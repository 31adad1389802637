"""Forward + backward at a long sequence, reporting time and peak device memory.

    python scripts/long_sequence.py --seqlen 131072 --heads 16 --head-dim 128

Inputs, outputs and gradients of B*T*N*H elements take a few hundred MB at
128k tokens; a T x T buffer would need T*T*N*4 bytes (1 TiB here), so a run
that completes proves none is allocated.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlen", type=int, default=131072)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    shape = (args.batch, args.seqlen, args.heads, args.head_dim)
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), args.dtype) for _ in range(3))
    loss = lambda q, k, v: jnp.sum(
        jax_flash.attention(q, k, v, is_causal=bool(args.causal)).astype(jnp.float32)
    )
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    start = time.perf_counter()
    value, grads = jax.block_until_ready(step(q, k, v))
    elapsed = time.perf_counter() - start
    finite = all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use", 0)
    io_bytes = 7 * q.size * q.dtype.itemsize  # q, k, v, out, dq, dk, dv
    print(f"T={args.seqlen} B={args.batch} N={args.heads} H={args.head_dim} causal={args.causal} "
          f"{args.dtype}: fwd+bwd {elapsed:.2f} s (incl. compile), grads finite={finite}, "
          f"peak device memory {peak / 2**20:.0f} MiB (inputs+outputs+grads {io_bytes / 2**20:.0f} MiB; "
          f"a T x T float32 buffer per head would be {args.seqlen**2 * 4 / 2**30:.0f} GiB)")


if __name__ == "__main__":
    main()
