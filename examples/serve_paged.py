"""Serve a model trained by train_gpt_flax.py: several prompts of different
lengths generated in batches over one paged KV pool (examples/paged_decode.py:
blocks taken from a free list as sequences grow and given back when they
finish, waiting prompts admitted into freed slots), then the texts and the
decode rate.

    python examples/train_gpt_flax.py --out run/        # writes run/checkpoint.msgpack
    python examples/serve_paged.py --checkpoint run/ --max-new-tokens 100
    python examples/serve_paged.py --checkpoint run/ --prompt "def " --prompt "The class " --max-batch 2
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax.numpy as jnp
from flax import nnx

from common import CharCorpus
from paged_decode import generate
from train_gpt_flax import GPT, context, restore_params

# Different lengths on purpose: one batch holds sequences at different positions.
DEFAULT_PROMPTS = ("The ", "A class definition ", "\n", "If the expression is true, then ",
                   "Exceptions are raised ")


def load_model(checkpoint_dir: str, corpus: CharCorpus):
    """The GPT of a train_gpt_flax.py --out directory (its metrics.json's
    flags rebuild the model, checkpoint.msgpack fills its parameters), and
    those flags. It decodes with jax_flash whatever --attention trained it."""
    with open(os.path.join(checkpoint_dir, "metrics.json")) as f:
        flags = argparse.Namespace(**json.load(f)["args"])
    model = GPT(corpus.vocab, flags.seq_len, flags.width, flags.depth, flags.heads, "flash", flags.positions,
                jnp.dtype(flags.dtype), nnx.Rngs(0), sinks=getattr(flags, "sinks", False))
    restore_params(model, os.path.join(checkpoint_dir, "checkpoint.msgpack"))
    return model, flags


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="the --out directory of train_gpt_flax.py")
    p.add_argument("--prompt", action="append", help=f"repeat for several (default: {len(DEFAULT_PROMPTS)} "
                                                       "built-in prompts of different lengths)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-batch", type=int, default=None, help="sequences decoded together (default: all)")
    p.add_argument("--block-size", type=int, default=16, help="positions per block of the KV pool")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="blocks in the pool (default: every batch slot at its longest)")
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--stop", default="\n", help="a sequence ends after generating this character ('': never)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    corpus = CharCorpus()
    model, flags = load_model(args.checkpoint, corpus)
    prompts = [corpus.encode(text) for text in (args.prompt or DEFAULT_PROMPTS)]
    limits = context(flags)
    max_new = args.max_new_tokens
    if limits["max_length"] is not None:  # learned positions end at the trained length
        max_new = min(max_new, limits["max_length"] - max(len(t) for t in prompts))
        if max_new < 1:
            p.error(f"a prompt fills the model's {limits['max_length']} positions")
    if len(args.stop) > 1:
        p.error(f"--stop takes one character (the tokens are characters); got {args.stop!r}")
    stop = corpus.encode(args.stop)[0] if args.stop else None
    began = time.perf_counter()
    outputs, stats = generate(model, prompts, max_new, block_size=args.block_size, num_blocks=args.num_blocks,
                              max_batch=args.max_batch, temperature=args.temperature, seed=args.seed,
                              stop_token=stop, window=limits["window"])
    seconds = time.perf_counter() - began
    for prompt, generated in zip(prompts, outputs):
        print(f"--- {corpus.decode(prompt)!r} ({len(generated)} tokens)\n{corpus.decode(prompt + generated)}")
    print(f"{stats.tokens} tokens for {len(prompts)} prompts in {seconds:.2f} s (compiling included); "
          f"decode {stats.tokens_per_s:,.0f} tokens/s over {stats.decode_steps} steps, "
          f"{stats.prefill_calls} prefill calls, at most {stats.peak_blocks} blocks of {args.block_size} in use")
    return outputs, stats


if __name__ == "__main__":
    main()
