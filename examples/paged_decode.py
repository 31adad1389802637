"""Batched generation over one paged KV pool, for the Flax GPT of
train_gpt_flax.py (its `extend` method: the training parameters, a decoding
forward).

The pool is one [num_blocks, block_size, heads, head_dim] key array and one
value array per layer, shared by every sequence in flight. A sequence owns
the blocks its block table lists, in order; it takes one more from the free
list each time it crosses a block boundary and gives them all back when it
finishes (max tokens or a stop token), so a waiting prompt can take its slot
in the batch (continuous batching). Two compiled functions do the work: a
prefill of newly admitted prompts (right-padded to the longest, causal
jax_flash.attention) and a decode step of one token per slot
(jax_flash.paged_attention over the pool, ragged lengths). The host keeps
the tables and samples the next tokens.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


class Pages(NamedTuple):
    """Where a batch's new tokens go in the pool, and which keys they see."""

    block_tables: jax.Array  # int32 [B, M]: each sequence's blocks in order
    start: jax.Array  # int32 [B]: tokens already cached = the first new token's position
    lengths: jax.Array  # int32 [B]: tokens cached after this call (start + the valid new tokens)


def write_pages(cache, pages: Pages, positions, k, v):
    """Scatters new keys and values k, v [B, T, K, H] at positions [B, T]
    into one layer's pool (key_pool, value_pool) [num_blocks, block_size, K, H].
    Positions at or past a sequence's length (a short prompt's padding, an
    idle slot) write nowhere: an out-of-range block id, which mode="drop"
    skips, so they never touch another sequence's blocks."""
    key_pool, value_pool = cache
    num_blocks, block_size = key_pool.shape[:2]
    entry = jnp.clip(positions // block_size, 0, pages.block_tables.shape[1] - 1)
    blocks = jnp.take_along_axis(pages.block_tables, entry, axis=1)  # [B, T]
    blocks = jnp.where(positions < pages.lengths[:, None], blocks, num_blocks)
    offsets = positions % block_size
    return (key_pool.at[blocks, offsets].set(k, mode="drop"),
            value_pool.at[blocks, offsets].set(v, mode="drop"))


def init_cache(model, num_blocks: int, block_size: int) -> list:
    """A zero (key_pool, value_pool) per layer, in the model's compute dtype."""
    attn = model.blocks[0].attn
    width = attn.qkv.in_features
    shape = (num_blocks, block_size, attn.heads, width // attn.heads)
    return [(jnp.zeros(shape, model.dtype), jnp.zeros(shape, model.dtype)) for _ in model.blocks]


class BlockAllocator:
    """The pool's free list: block ids handed out one at a time, given back in bulk."""

    def __init__(self, num_blocks: int):
        self.free = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ... first

    def take(self) -> int:
        if not self.free:
            raise RuntimeError("the KV pool is out of blocks: give generate() a larger num_blocks")
        return self.free.pop()

    def give_back(self, blocks) -> None:
        self.free.extend(blocks)


@dataclasses.dataclass
class _Sequence:
    index: int  # which prompt
    prompt: list
    generated: list = dataclasses.field(default_factory=list)
    blocks: list = dataclasses.field(default_factory=list)
    cached: int = 0  # tokens whose keys and values are in the pool


@dataclasses.dataclass
class Stats:
    prefill_calls: int = 0
    decode_steps: int = 0
    tokens: int = 0  # generated tokens, all sequences
    decode_tokens: int = 0  # of those, the ones decode steps after the first produced
    decode_seconds: float = 0.0  # their wall time (the first step compiles)
    peak_blocks: int = 0  # most blocks in use at once

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else float("nan")


def generate(model, prompts, max_new_tokens: int, *, block_size: int = 16, num_blocks: int | None = None,
             max_batch: int | None = None, temperature: float = 0.0, seed: int = 0,
             stop_token: int | None = None, window: int | None = None):
    """Generates up to max_new_tokens after each prompt (lists of token ids).

    max_batch: sequences decoded together (default: all prompts); the others
    wait for a slot. temperature 0: greedy. stop_token: a sequence ends after
    generating it. window: keys a query sees back (None: all). num_blocks:
    the pool's size (default: every sequence at its longest at once).
    Returns (the generated tokens per prompt, Stats).
    """
    if not prompts or min(len(p) for p in prompts) < 1:
        raise ValueError("generate needs at least one prompt, each at least one token long")
    if max_new_tokens < 1:
        return [[] for _ in prompts], Stats()
    slots = min(max_batch or len(prompts), len(prompts))
    longest = max(len(p) for p in prompts) + max_new_tokens
    table_width = math.ceil(longest / block_size)  # M: blocks of the longest sequence
    if num_blocks is None:
        num_blocks = slots * table_width
    prompt_width = max(len(p) for p in prompts)  # prefill pads to it: one compilation

    graphdef, state = nnx.split(model)

    # The pool is donated: XLA updates it in place instead of copying it every step.
    @functools.partial(jax.jit, static_argnames=("prefill",), donate_argnums=(2,))
    def extend(state, tokens, cache, pages, prefill):
        return nnx.merge(graphdef, state).extend(tokens, cache, pages, window=window, prefill=prefill)

    cache = init_cache(model, num_blocks, block_size)
    allocator = BlockAllocator(num_blocks)
    tables = np.zeros((slots, table_width), np.int32)  # rows of idle slots: never read or written
    running: list[_Sequence | None] = [None] * slots
    waiting = collections.deque(_Sequence(i, list(p)) for i, p in enumerate(prompts))
    pending = np.zeros(slots, np.int32)  # each slot's newest token, not yet in the pool
    outputs = [None] * len(prompts)
    rng = np.random.default_rng(seed)
    stats = Stats()

    def pages(start, lengths):
        return Pages(jnp.asarray(tables), jnp.asarray(start, jnp.int32), jnp.asarray(lengths, jnp.int32))

    def grow(slot, seq, length):  # blocks for positions < length
        while len(seq.blocks) * block_size < length:
            seq.blocks.append(allocator.take())
            tables[slot, len(seq.blocks) - 1] = seq.blocks[-1]
        stats.peak_blocks = max(stats.peak_blocks, num_blocks - len(allocator.free))

    def emit(slot, logits):
        """Samples slot's next token; finishes the sequence on max tokens or the stop token."""
        seq = running[slot]
        token = _sample(logits, temperature, rng)
        seq.generated.append(token)
        stats.tokens += 1
        pending[slot] = token
        if len(seq.generated) == max_new_tokens or token == stop_token:
            outputs[seq.index] = seq.generated
            allocator.give_back(seq.blocks)
            running[slot] = None

    while waiting or any(seq is not None for seq in running):
        admitted = [s for s in range(slots) if running[s] is None][: len(waiting)]
        if admitted:
            # Prefill every newly admitted prompt in one call; other slots write nothing (length 0).
            tokens = np.zeros((slots, prompt_width), np.int32)
            lengths = np.zeros(slots, np.int32)
            for slot in admitted:
                seq = running[slot] = waiting.popleft()
                grow(slot, seq, len(seq.prompt))
                tokens[slot, : len(seq.prompt)] = seq.prompt
                lengths[slot] = seq.cached = len(seq.prompt)
            logits, cache = extend(state, jnp.asarray(tokens), cache, pages(np.zeros(slots), lengths), True)
            stats.prefill_calls += 1
            logits = np.asarray(logits)
            for slot in admitted:
                emit(slot, logits[slot, lengths[slot] - 1])
            continue
        # One decode step: every running sequence's pending token goes into the pool and attends.
        start = np.zeros(slots, np.int32)
        for slot, seq in enumerate(running):
            if seq is not None:
                grow(slot, seq, seq.cached + 1)
                start[slot] = seq.cached
        active = np.array([seq is not None for seq in running])
        began = time.perf_counter()
        logits, cache = extend(state, jnp.asarray(pending[:, None]), cache, pages(start, start + active), False)
        logits = np.asarray(logits)  # waits for the step
        if stats.decode_steps > 0:
            stats.decode_seconds += time.perf_counter() - began
            stats.decode_tokens += int(active.sum())
        stats.decode_steps += 1
        for slot, seq in enumerate(running):
            if seq is not None:
                seq.cached += 1
                emit(slot, logits[slot, 0])
    return outputs, stats


def _sample(logits, temperature: float, rng) -> int:
    """Greedy (temperature 0) or a draw from softmax(logits / temperature)."""
    logits = np.asarray(logits, np.float64)
    if temperature <= 0:
        return int(np.argmax(logits))
    logits = logits / temperature
    probs = np.exp(logits - logits.max())
    return int(rng.choice(len(probs), p=probs / probs.sum()))
