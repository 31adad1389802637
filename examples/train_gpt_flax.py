"""Train a small GPT-style character-level language model with Flax NNX,
its attention computed by jax_flash.attention (fused, causal).

The corpus is the Python reference documentation that ships with CPython
(examples/common.py), so nothing is downloaded. Defaults train on a laptop
CPU in a few minutes with clearly falling loss:

    python examples/train_gpt_flax.py
    python examples/train_gpt_flax.py --attention xla   # same model, jax's attention

The text sample at the end decodes token by token over a paged KV cache
(GPT.extend, the training parameters; examples/paged_decode.py), and
examples/serve_paged.py serves the checkpoint that --out writes.

Sharded: `--mesh data=D,seq=S` trains on a D x S device mesh, the batch split
over `data` (data parallelism: XLA all-reduces the gradients) and the
sequence over `seq` (context parallelism: jax_flash.ring_attention inside
shard_map). `--host-devices N` makes N CPU devices for it where there are
not that many accelerators (it must be on the command line: jax reads it as
it starts):

    python examples/train_gpt_flax.py --host-devices 4 --mesh data=2,seq=2

`--sinks` gives every layer learned attention sinks (gpt-oss): one logit
per head in every query's softmax, trained with the model, and used as
they are by the ring (`--mesh`) and by the paged-cache decoding.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import math
import os
import sys


def _force_host_devices(argv):
    """--host-devices N: set before jax is imported (XLA reads its flags once)."""
    if "--host-devices" in argv:
        count = argv[argv.index("--host-devices") + 1]
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={count}").strip()


if __name__ == "__main__":
    _force_host_devices(sys.argv)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_flash  # noqa: E402
from common import (  # noqa: E402
    CharCorpus, Throughput, add_common_arguments, apply_rope, log_step, progress, write_run_outputs)
from paged_decode import Pages, generate, write_pages  # noqa: E402

# Batch over the mesh axis "data", sequence over "seq" ([B, T, ...] arrays).
BATCH_SEQ = P("data", "seq")


def _shard_map():
    if hasattr(jax, "shard_map"):
        return jax.shard_map
    from jax.experimental.shard_map import shard_map  # jax < 0.7

    return shard_map


def parse_mesh(text: str, devices) -> Mesh:
    """'data=D,seq=S' (either may be left out: size 1) -> a D x S Mesh over
    the first D * S of `devices`."""
    sizes = dict(part.split("=") for part in text.split(","))
    if not sizes or not set(sizes) <= {"data", "seq"}:
        raise ValueError(f"--mesh takes data=D and/or seq=S, e.g. data=2,seq=2; got {text!r}")
    d, s = int(sizes.get("data", 1)), int(sizes.get("seq", 1))
    if d * s > len(devices):
        raise ValueError(f"--mesh {text} needs {d * s} devices; {len(devices)} available "
                         "(--host-devices N makes N CPU devices)")
    return Mesh(np.array(devices[:d * s]).reshape(d, s), ("data", "seq"))


class CausalSelfAttention(nnx.Module):
    def __init__(self, width: int, heads: int, attention: str, rope: bool, dtype, rngs: nnx.Rngs,
                 mesh: Mesh | None = None, sinks: bool = False):
        self.heads, self.attention, self.rope, self.dtype = heads, attention, rope, dtype
        self.mesh = mesh  # with a mesh: ring attention over its "seq" axis
        self.qkv = nnx.Linear(width, 3 * width, use_bias=False, dtype=dtype, rngs=rngs)
        self.proj = nnx.Linear(width, width, use_bias=False, dtype=dtype, rngs=rngs)
        # Attention sinks (gpt-oss): a learned float32 logit per head, from 0
        # (a sink as likely as a key whose logit is 0).
        self.sinks = nnx.Param(jnp.zeros((heads,), jnp.float32)) if sinks else None

    def _sinks(self):
        return None if self.sinks is None else self.sinks[...]

    def _heads(self, x, positions=None):  # x [B, T, C] -> q, k, v [B, T, N, H]
        b, t, c = x.shape
        q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
        q, k, v = (y.reshape(b, t, self.heads, c // self.heads) for y in (q, k, v))  # BTNH
        if self.rope:  # global positions: outside the shard_map
            q, k = apply_rope(q, positions=positions), apply_rope(k, positions=positions)
        return q, k, v

    def __call__(self, x):  # x: [B, T, C]
        b, t, c = x.shape
        q, k, v = self._heads(x)
        if self.attention == "flash" and self.mesh is not None:
            # Each device holds a [B / data, T / seq] block of q, k, v; K/V
            # travel around the "seq" ring. Contiguous layout: the tokens stay
            # in order (zigzag would balance the causal work but needs the
            # positions permuted to match).
            ring = functools.partial(jax_flash.ring_attention, axis_name="seq", is_causal=True,
                                     layout="contiguous")
            spec = P("data", "seq", None, None)
            sinks = () if self.sinks is None else (self._sinks(),)  # replicated: P()
            y = _shard_map()(lambda q, k, v, *s: ring(q, k, v, sinks=s[0] if s else None), mesh=self.mesh,
                             in_specs=(spec,) * 3 + (P(),) * len(sinks), out_specs=spec)(q, k, v, *sinks)
        elif self.attention == "flash":
            y = jax_flash.attention(q, k, v, is_causal=True, sinks=self._sinks())
        else:
            y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=self.attention)
        return self.proj(y.reshape(b, t, c))

    def extend(self, x, cache, pages: Pages, window: int | None, prefill: bool):
        """Decoding: x [B, T, C] are each sequence's new tokens (at positions
        pages.start + t); their keys and values go into this layer's paged
        pool `cache` = (key_pool, value_pool), then they attend to the cache.

        prefill: the sequences start empty (start 0; ragged prompts padded on
        the right), so their keys are exactly the new ones: one causal
        jax_flash.attention call. Otherwise every new token is valid
        (lengths = start + T) and jax_flash.paged_attention reads the pool.
        window: keys a query sees back (None: all), for decoding past the
        trained context with rotary positions.
        """
        b, t, c = x.shape
        positions = pages.start[:, None] + jnp.arange(t, dtype=jnp.int32)  # [B, T]
        q, k, v = self._heads(x, positions)
        cache = write_pages(cache, pages, positions, k, v)
        if prefill:
            y = jax_flash.attention(q, k, v, is_causal=True, sinks=self._sinks(),
                                    local_window_size=None if window is None else (window, 0))
        else:
            y = jax_flash.paged_attention(q, *cache, pages.block_tables, pages.lengths,
                                          local_window_size=window, sinks=self._sinks())
        return self.proj(y.reshape(b, t, c)), cache


class Block(nnx.Module):
    def __init__(self, width, heads, attention, rope, dtype, rngs, mesh=None, sinks=False):
        self.norm1 = nnx.LayerNorm(width, rngs=rngs)
        self.attn = CausalSelfAttention(width, heads, attention, rope, dtype, rngs, mesh, sinks)
        self.norm2 = nnx.LayerNorm(width, rngs=rngs)
        self.fc = nnx.Linear(width, 4 * width, dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(4 * width, width, dtype=dtype, rngs=rngs)

    def __call__(self, x):  # pre-norm residual blocks
        x = x + self.attn(self.norm1(x))
        return x + self._mlp(x)

    def _mlp(self, x):
        return self.out(jax.nn.gelu(self.fc(self.norm2(x))))

    def extend(self, x, cache, pages, window, prefill):  # CausalSelfAttention.extend's arguments
        y, cache = self.attn.extend(self.norm1(x), cache, pages, window, prefill)
        x = x + y
        return x + self._mlp(x), cache


class GPT(nnx.Module):
    def __init__(self, vocab, seq_len, width, depth, heads, attention, positions, dtype, rngs,
                 mesh=None, sinks=False):
        self.dtype = dtype
        self.tok = nnx.Embed(vocab, width, rngs=rngs)
        # Learned positions, or none here and rotary embeddings inside attention.
        self.pos = nnx.Embed(seq_len, width, rngs=rngs) if positions == "learned" else None
        blocks = [Block(width, heads, attention, positions == "rope", dtype, rngs, mesh, sinks) for _ in range(depth)]
        self.blocks = nnx.List(blocks) if hasattr(nnx, "List") else blocks  # nnx.List: flax >= 0.12
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.head = nnx.Linear(width, vocab, use_bias=False, rngs=rngs)

    def __call__(self, tokens):  # [B, T] int32 -> logits [B, T, vocab] float32
        x = self._embed(tokens, jnp.arange(tokens.shape[1])[None])
        for block in self.blocks:
            x = block(x)
        return self._logits(x)

    def extend(self, tokens, cache, pages: Pages, window: int | None = None, prefill: bool = False):
        """Decoding with a paged KV cache, on the parameters training uses:
        tokens [B, T] int32, each sequence's new tokens at positions
        pages.start + t; cache: a (key_pool, value_pool) per layer, each
        [num_blocks, block_size, heads, head_dim] (paged_decode.init_cache).
        Returns the new tokens' logits [B, T, vocab] and the updated cache
        (CausalSelfAttention.extend says what prefill and window mean)."""
        positions = pages.start[:, None] + jnp.arange(tokens.shape[1], dtype=jnp.int32)
        x = self._embed(tokens, positions)
        new_cache = []
        for block, layer_cache in zip(self.blocks, cache):
            x, layer_cache = block.extend(x, layer_cache, pages, window, prefill)
            new_cache.append(layer_cache)
        return self._logits(x), new_cache

    def _embed(self, tokens, positions):  # positions [B or 1, T]
        x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos(positions)
        return x.astype(self.dtype)

    def _logits(self, x):
        return self.head(self.norm(x).astype(jnp.float32))


def _map_keys(tree, fn):
    return {fn(k): _map_keys(v, fn) for k, v in tree.items()} if isinstance(tree, dict) else tree


def _int_key(k):
    return int(k) if isinstance(k, str) and k.isdigit() else k


def save_params(model, path):
    """The model's parameters as msgpack (flax.serialization of a pure dict).

    The blocks' list indices are written as strings: flax < 0.11 restores
    msgpack with strict (string-only) map keys."""
    from flax import serialization

    pure = _map_keys(nnx.to_pure_dict(nnx.state(model, nnx.Param)), str)
    with open(path, "wb") as f:
        f.write(serialization.msgpack_serialize(pure))


def restore_params(model, path):
    from flax import serialization

    with open(path, "rb") as f:
        pure = _map_keys(serialization.msgpack_restore(f.read()), _int_key)
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)


def context(model_args) -> dict:
    """How far the model decodes: learned positions stop at the trained
    length; rotary ones continue with a sliding window of that length
    (relative positions stay within what training saw)."""
    if model_args.positions == "learned":
        return {"max_length": model_args.seq_len, "window": None}
    return {"max_length": None, "window": model_args.seq_len - 1}


def sample_with_cache(model, corpus, args, prompt: str, temperature: float = 0.8) -> str:
    """Text sampled token by token over a paged KV cache (paged_decode.generate)."""
    tokens = corpus.encode(prompt)
    limits = context(args)
    length = args.sample_chars
    if limits["max_length"] is not None and len(tokens) + length > limits["max_length"]:
        length = max(limits["max_length"] - len(tokens), 0)
        print(f"sample: {length} characters (learned positions end at --seq-len {args.seq_len})")
    [generated], _ = generate(model, [tokens], length, temperature=temperature, seed=args.seed,
                              window=limits["window"])
    return corpus.decode(tokens + generated)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(p)
    p.add_argument("--attention", choices=["flash", "xla", "cudnn"], default="flash")
    p.add_argument("--mesh", default=None,
                   help="data=D,seq=S (or one of them): train on a D x S mesh (batch over data, "
                        "sequence over seq by ring attention; needs --attention flash)")
    p.add_argument("--host-devices", type=int, default=0,
                   help="N CPU devices for --mesh (read as the script starts)")
    p.add_argument("--sinks", action="store_true",
                   help="learned attention sinks in every layer (gpt-oss; needs --attention flash)")
    args = p.parse_args(argv)
    if args.sinks and args.attention != "flash":
        p.error("--sinks needs --attention flash (jax.nn.dot_product_attention has no sinks)")

    corpus = CharCorpus()
    chars = corpus.chars
    mesh = None
    if args.mesh:
        if args.attention != "flash":
            p.error("--mesh needs --attention flash (ring attention)")
        devices = jax.devices("cpu") if args.host_devices else jax.devices()
        mesh = parse_mesh(args.mesh, devices)
    print(f"corpus: {corpus.size:,} chars, vocab {corpus.vocab}; device {jax.devices()[0].device_kind}; "
          f"attention={args.attention}" + (f"; mesh {dict(mesh.shape)}" if mesh else ""))

    model = GPT(corpus.vocab, args.seq_len, args.width, args.depth, args.heads, args.attention,
                args.positions, jnp.dtype(args.dtype), nnx.Rngs(args.seed), mesh, args.sinks)
    if mesh is not None:  # parameters replicated over the mesh (XLA all-reduces their gradients)
        state = nnx.state(model)
        nnx.update(model, jax.device_put(state, NamedSharding(mesh, P())))
    warmup = min(args.warmup, args.steps - 1)  # a short (e.g. resumed) run still decays
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, warmup, args.steps, args.lr / 10)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.1))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    if mesh is not None:  # its state too: step 1 returns it replicated, and step 2 would compile again
        nnx.update(optimizer, jax.device_put(nnx.state(optimizer), NamedSharding(mesh, P())))
    _UPDATE_TAKES_MODEL = "model" in inspect.signature(nnx.Optimizer.update).parameters

    def loss_fn(model, x, y):
        logits = model(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @nnx.jit
    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        if _UPDATE_TAKES_MODEL:
            optimizer.update(model, grads)
        else:  # flax < 0.11: update(grads)
            optimizer.update(grads)
        return loss

    eval_step = nnx.jit(loss_fn)
    rng = np.random.default_rng(args.seed)

    def batch(split):
        arrays = corpus.batch(rng, split, args.batch_size, args.seq_len)
        if mesh is not None:
            return tuple(jax.device_put(a, NamedSharding(mesh, BATCH_SEQ)) for a in arrays)
        return tuple(jnp.asarray(a) for a in arrays)

    checkpoint = os.path.join(args.out, "checkpoint.msgpack") if args.out else None
    if args.resume:
        restore_params(model, checkpoint)
        print(f"resumed from {checkpoint}")

    history = []
    meter = Throughput()
    bar = progress(range(1, args.steps + 1), args.steps, not args.no_progress)
    for step in bar:
        loss = train_step(model, optimizer, *batch("train"))
        meter.count(args.batch_size * args.seq_len)
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            log_step(bar, history, step, float(loss), float(eval_step(model, *batch("valid"))), meter)
        if step == 1:
            meter.restart()  # the rate excludes compiling the train and eval steps
    sample = ""
    if args.sample_chars > 0 and mesh is not None:
        print("sampling skipped with --mesh (one sequence does not split over the mesh)")
    elif args.sample_chars > 0:
        sample = sample_with_cache(model, corpus, args, "The ")
        print("sample:", sample)
    if args.out:
        write_run_outputs(args.out, args, history, sample)
        save_params(model, checkpoint)
    first, last = history[0]["loss"], history[-1]["loss"]
    print(f"loss {first:.3f} -> {last:.3f} (uniform guess: {math.log(len(chars)):.3f})")
    return history


if __name__ == "__main__":
    main()
