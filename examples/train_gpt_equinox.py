"""Train a small GPT-style character-level language model with Equinox, its
attention layers `jax_flash.equinox.MultiheadAttention` (the drop-in for
`equinox.nn.MultiheadAttention`, causal, fused).

Same corpus and defaults as train_gpt_flax.py (a few CPU minutes):

    python examples/train_gpt_equinox.py
    python examples/train_gpt_equinox.py --attention equinox   # eqx's own attention, same weights
"""

from __future__ import annotations

import argparse
import math
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jax_flash.equinox
from common import (
    CharCorpus, Throughput, add_common_arguments, apply_rope, log_step, progress, sample_text,
    write_run_outputs)


class Block(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    fc: eqx.nn.Linear
    out: eqx.nn.Linear
    flash: bool = eqx.field(static=True)
    rope: bool = eqx.field(static=True)

    def __init__(self, width, heads, flash, rope, key):
        k1, k2, k3 = jax.random.split(key, 3)
        attn_cls = jax_flash.equinox.MultiheadAttention if flash else eqx.nn.MultiheadAttention
        self.norm1 = eqx.nn.LayerNorm(width)
        self.attn = attn_cls(heads, width, key=k1)
        self.norm2 = eqx.nn.LayerNorm(width)
        self.fc = eqx.nn.Linear(width, 4 * width, key=k2)
        self.out = eqx.nn.Linear(4 * width, width, key=k3)
        self.flash = flash
        self.rope = rope

    def __call__(self, x):  # x: [T, C], pre-norm residual block
        h = jax.vmap(self.norm1)(x)
        # Rotary embeddings through equinox's process_heads hook ([T, N, H] heads).
        rope = (lambda q, k, v: (apply_rope(q), apply_rope(k), v)) if self.rope else None
        if self.flash:
            h = self.attn(h, h, h, is_causal=True, process_heads=rope)  # no [T, T] mask materialized
        else:
            h = self.attn(h, h, h, jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool)),
                          process_heads=rope)
        x = x + h
        h = jax.vmap(lambda v: self.out(jax.nn.gelu(self.fc(v))))(jax.vmap(self.norm2)(x))
        return x + h


class GPT(eqx.Module):
    tok: eqx.nn.Embedding
    pos: eqx.nn.Embedding | None
    blocks: list
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, vocab, seq_len, width, depth, heads, flash, positions, key):
        keys = jax.random.split(key, depth + 3)
        self.tok = eqx.nn.Embedding(vocab, width, key=keys[0])
        # Learned positions, or none here and rotary embeddings inside attention.
        self.pos = eqx.nn.Embedding(seq_len, width, key=keys[1]) if positions == "learned" else None
        self.blocks = [Block(width, heads, flash, positions == "rope", k) for k in keys[3:]]
        self.norm = eqx.nn.LayerNorm(width)
        self.head = eqx.nn.Linear(width, vocab, use_bias=False, key=keys[2])

    def __call__(self, tokens):  # [T] int32 -> logits [T, vocab]
        x = jax.vmap(self.tok)(tokens)
        if self.pos is not None:
            x = x + jax.vmap(self.pos)(jnp.arange(tokens.shape[0]))
        for block in self.blocks:
            x = block(x)
        return jax.vmap(self.head)(jax.vmap(self.norm)(x))


def cast_floats(model, dtype):
    """The model with every float array cast to `dtype` (a differentiable copy)."""
    return jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(p)
    p.add_argument("--attention", choices=["flash", "equinox"], default="flash")
    args = p.parse_args(argv)

    corpus = CharCorpus()
    print(f"corpus: {corpus.size:,} chars, vocab {corpus.vocab}; device {jax.devices()[0].device_kind}; "
          f"attention={args.attention}")
    model = GPT(corpus.vocab, args.seq_len, args.width, args.depth, args.heads,
                args.attention == "flash", args.positions, jax.random.key(args.seed))
    # float32 master weights whatever jax's default float is; --dtype is the
    # compute dtype, applied by casting a copy of the weights inside the step.
    model = cast_floats(model, jnp.float32)
    compute_dtype = jnp.dtype(args.dtype)
    warmup = min(args.warmup, args.steps - 1)  # a short (e.g. resumed) run still decays
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, warmup, args.steps, args.lr / 10)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.1))
    checkpoint = os.path.join(args.out, "model.eqx") if args.out else None
    if args.resume:
        model = eqx.tree_deserialise_leaves(checkpoint, model)
        print(f"resumed from {checkpoint}")
    opt_state = tx.init(eqx.filter(model, eqx.is_inexact_array))

    def loss_fn(model, x, y):
        logits = jax.vmap(cast_floats(model, compute_dtype))(x).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @eqx.filter_jit
    def train_step(model, opt_state, x, y):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    eval_loss = eqx.filter_jit(loss_fn)
    rng = np.random.default_rng(args.seed)
    history, meter = [], Throughput()
    bar = progress(range(1, args.steps + 1), args.steps, not args.no_progress)
    for step in bar:
        x, y = corpus.batch(rng, "train", args.batch_size, args.seq_len)
        model, opt_state, loss = train_step(model, opt_state, x, y)
        meter.count(x.size)
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            val_loss = float(eval_loss(model, *corpus.batch(rng, "valid", args.batch_size, args.seq_len)))
            log_step(bar, history, step, float(loss), val_loss, meter)
        if step == 1:
            meter.restart()  # the rate excludes compiling the train and eval steps
    sample = ""
    if args.sample_chars > 0:
        logits_fn = eqx.filter_jit(
            lambda model, x: jax.vmap(cast_floats(model, compute_dtype))(x).astype(jnp.float32))
        sample = sample_text(lambda x: logits_fn(model, jnp.asarray(x)), corpus, args.seq_len,
                             "The ", args.sample_chars, seed=args.seed)
        print("sample:", sample)
    if args.out:
        write_run_outputs(args.out, args, history, sample)
        eqx.tree_serialise_leaves(checkpoint, model)
    print(f"loss {history[0]['loss']:.3f} -> {history[-1]['loss']:.3f} "
          f"(uniform guess: {math.log(corpus.vocab):.3f})")
    return history


if __name__ == "__main__":
    main()
