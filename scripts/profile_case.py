"""One named attention call, run twice under jit, for Nsight Compute.

    python scripts/profile_case.py packed          # 4 documents per row, causal
    python scripts/profile_case.py one_doc_1024    # T=1024 B=16, segment ids of one document

Cases (bf16, H=128, N=16; `grad` ones run the fused backward too):
  packed          B=4 T=4096, 4 contiguous documents per row, causal, fwd
  plain_1024      B=16 T=1024 causal, fwd (what `packed` would cost without
                  the feature variant: the same tiles per document)
  one_doc_1024    B=16 T=1024 causal with all-zero segment ids: the feature
                  variant over plain_1024's tiles
  packed_grad, plain_grad_1024: the same with the backward
  det_grad        B=4 T=4096 non-causal, deterministic=True, fwd+bwd
  default_grad    the same without deterministic
  dropout_grad    the same with dropout_rate=0.1 (the kMasksDropout variants)
  keymask_grad    the same with a [B, 1, 1, S] key-padding mask (30% hidden)
  padmask         B=4 T=4096 non-causal, fwd, the benchmark's mask case: the
                  last S/8 keys hidden by a [B, 1, 1, S] mask
  kvlen           the same padding as key_value_seq_lengths
  softcap         B=4 T=4096 non-causal, fwd, logits_soft_cap=30
  prefix_lm       B=4 T=4096 non-causal, fwd, the benchmark's prefix-LM mask
                  [1, 1, T, S] (keys j < max(i + 1, T / 4)): its block summary
                  and the kernel (ncu: the summary's reductions are kernels
                  of their own, `PROFILE_CASES="prefix_lm:."` lists them all)
  striped         the same with the striped_mask variant's mask ((i + j) % 10
                  hides: every block mixed)
  causal_mask     the same with a per-query causal mask [1, 1, T, S] (j <= i)
                  and is_causal=False: the summary's trims against the causal
                  kernel's own (plain causal's work, per-query mask path)
  visible_mask    the same with an all-True [1, 1, T, S] mask: every block
                  visible whole (the summary's cost over plain non-causal)
  window          B=4 T=4096 causal, fwd, local_window_size=(512, 0) (the
                  benchmark's window case)
  plain256_1024   B=16 T=1024 causal, N=8, H=256, fwd (v30: 0.74x of FA3; at 256
                  Q is released only after both epilogues, PERF Next 4)
  det256_grad, default256_grad: det_grad and default_grad at N=8, H=256 (v38:
                  the deterministic 256 backward at 0.64-0.68x of the default)
  long_grad_131072, long_grad_16384: B=1 T=131072 / 16384 causal, N=16, fwd+bwd
                  (v40: the backward at 0.86x of FA3 at 131072, 0.93x at
                  16384: its L2 hit rate and DRAM throughput, one launch of
                  ~0.3 s at 131072)
  (default, dropout, keymask without `_grad`: their forward alone)
scripts/profile_features.sh runs them under ncu and summarizes.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash

case = sys.argv[1]
grad = case.endswith("grad") or "_grad_" in case
b, t = (16, 1024) if case.endswith("1024") else (4, 4096)
if case.startswith("long"):
    b, t = 1, int(case.rsplit("_", 1)[1])
n, h = (8, 256) if "256" in case else (16, 128)
rng = np.random.default_rng(0)
q, k, v = (jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.bfloat16) for _ in range(3))
kwargs = dict(is_causal=not case.startswith(("det", "default", "dropout", "keymask", "padmask", "kvlen", "softcap",
                                              "prefix_lm", "striped", "causal_mask", "visible_mask")))
if case.startswith("packed"):
    ids = jnp.asarray(np.repeat(np.arange(4), t // 4)[None].repeat(b, 0), jnp.int32)
    kwargs.update(q_segment_ids=ids, kv_segment_ids=ids)
elif case.startswith("one_doc"):
    ids = jnp.zeros((b, t), jnp.int32)
    kwargs.update(q_segment_ids=ids, kv_segment_ids=ids)
if case.startswith("window"):
    kwargs.update(local_window_size=(512, 0))
if case.startswith("det"):
    kwargs.update(deterministic=True)
elif case.startswith("dropout"):
    kwargs.update(dropout_rate=0.1, dropout_rng=jax.random.key(0))
elif case.startswith("keymask"):
    kwargs.update(mask=jnp.asarray(rng.random((b, 1, 1, t)) > 0.3))
elif case.startswith("padmask"):
    kwargs.update(mask=jnp.asarray(np.broadcast_to(np.arange(t) < t - t // 8, (b, 1, 1, t))))
elif case.startswith("softcap"):
    kwargs.update(logits_soft_cap=30.0)
elif case.startswith("prefix_lm"):
    i = np.arange(t)
    kwargs.update(mask=jnp.asarray((i[None, :] < np.maximum(i + 1, t // 4)[:, None])[None, None]))
elif case.startswith("striped"):
    i = np.arange(t)
    kwargs.update(mask=jnp.asarray(((i[:, None] + i[None, :]) % 10 != 0)[None, None]))
elif case.startswith("causal_mask"):
    i = np.arange(t)
    kwargs.update(mask=jnp.asarray((i[None, :] <= i[:, None])[None, None]))
elif case.startswith("visible_mask"):
    kwargs.update(mask=jnp.ones((1, 1, t, t), bool))
elif case.startswith("kvlen"):
    kwargs.update(key_value_seq_lengths=jnp.full((b,), t - t // 8, jnp.int32))


def forward(q, k, v):
    return jax_flash.attention(q, k, v, **kwargs)


if grad:
    f = jax.jit(jax.grad(lambda q, k, v: jnp.sum(forward(q, k, v).astype(jnp.float32)), (0, 1, 2)))
else:
    f = jax.jit(forward)
for _ in range(2):
    jax.block_until_ready(f(q, k, v))
