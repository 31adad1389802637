"""What per-query boolean masks cost on the CPU path: a jitted float32
forward + backward (value_and_grad of the output's sum w.r.t. q, k, v) at
B=1, T=S=2048, N=4, H=64, median of 5 interleaved runs, against the plain
call: causal, a prefix-LM mask ([1, 1, T, S]: query i sees keys
j < max(i + 1, T / 4); 53% of the pairs visible, its blocks above the
diagonal hidden whole) and a random mask with 90% of the pairs visible.

    python scripts/cpu_mask_costs.py
"""
import time, statistics, jax, jax.numpy as jnp, numpy as np, jax_flash
jax.config.update("jax_platforms", "cpu")
t, n, h = 2048, 4, 64
rng = np.random.default_rng(0)
q, k, v = (jnp.asarray(rng.standard_normal((1, t, n, h)), jnp.float32) for _ in range(3))
i = np.arange(t)
prefix = jnp.asarray((i[None, :] < np.maximum(i + 1, t // 4)[:, None])[None, None])
cases = {"plain": dict(), "causal": dict(is_causal=True), "prefix_lm": dict(mask=prefix),
         "dense_random": dict(mask=jnp.asarray(rng.random((1, 1, t, t)) > 0.1))}
fns = {name: jax.jit(jax.value_and_grad(lambda q, k, v, kw=kw: jnp.sum(jax_flash.attention(q, k, v, **kw)), (0, 1, 2))) for name, kw in cases.items()}
for f in fns.values(): jax.block_until_ready(f(q, k, v))
times = {name: [] for name in fns}
for _ in range(5):
    for name, f in fns.items():
        s = time.perf_counter(); jax.block_until_ready(f(q, k, v)); times[name].append(time.perf_counter() - s)
for name, ts in times.items():
    m = statistics.median(ts) * 1e3
    print(f"{name:13s} {m:7.1f} ms  {m / (statistics.median(times['plain']) * 1e3):.2f}x plain")
# visible fraction of prefix_lm
print("prefix_lm visible", float(np.mean(np.asarray(prefix))))
