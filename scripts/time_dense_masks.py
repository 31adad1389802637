"""Forward times of per-query [1, 1, T, S] masks against the plain kernels (bf16,
B=4, T=S=4096, N=16, H=128), the mask a jit argument (no constant folding):
what the sm90 forward's summary trims and skips buy per mask shape. Each line:
the mask, its visible fraction, ms, and ms over visible fraction relative to
plain non-causal (1.0: the visible pairs at plain's speed)."""
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash

b, t, n, h = 4, 4096, 16, 128
rng = np.random.default_rng(0)
q, k, v = (jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.bfloat16) for _ in range(3))
i, j = np.arange(t)[:, None], np.arange(t)[None, :]
masks = {
    "all_visible": np.ones((t, t), bool),
    "causal": j <= i,
    "prefix_lm": j < np.maximum(i + 1, t // 4),
    "first_half_keys": np.broadcast_to(j < t // 2, (t, t)),
    "striped": (i + j) % 10 != 0,
}


def best_ms(f, *args):
    jax.block_until_ready(f(*args))
    best = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(10):
            out = f(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / 10)
    return best * 1e3


plain = best_ms(jax.jit(lambda q, k, v: jax_flash.attention(q, k, v)), q, k, v)
causal = best_ms(jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, is_causal=True)), q, k, v)
print(f"plain {plain:.3f} ms, plain causal {causal:.3f} ms")
f = jax.jit(lambda q, k, v, m: jax_flash.attention(q, k, v, mask=m))
for name, m in masks.items():
    ms = best_ms(f, q, k, v, jnp.asarray(m[None, None]))
    frac = m.mean()
    print(f"{name:16s} visible {frac:.3f}  {ms:.3f} ms  per visible pair {ms / frac / plain:.2f}x plain")
