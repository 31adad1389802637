"""What the training examples share: the corpus (the Python reference
documentation that ships with CPython, `pydoc_data.topics`, ~465k characters
of English prose and grammar, so nothing is downloaded; character-level
tokens), the command-line flags, a progress bar, the loss curve and sampling."""

from __future__ import annotations

import argparse
import time

import numpy as np


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    """Flags every training example takes (defaults: a few CPU minutes)."""
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None,
                   help="directory for metrics.json, loss_curve.png, sample.txt and the checkpoint")
    p.add_argument("--resume", action="store_true", help="start from the checkpoint in --out")
    p.add_argument("--sample-chars", type=int, default=200, help="characters to generate at the end")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--positions", choices=["rope", "learned"], default="rope",
                   help="rotary embeddings on q/k, or a learned position table")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="compute dtype (parameters and optimizer state stay float32)")


class Throughput:
    """Training tokens per second since the last restart.

    Restarted after the first step (and its logging), so compiling the train
    and eval steps does not count against the rate.
    """

    def __init__(self):
        self.restart()

    def restart(self):
        self.tokens, self.start = 0, time.perf_counter()

    def count(self, tokens: int):
        self.tokens += tokens

    def rate(self) -> float:
        return self.tokens / max(time.perf_counter() - self.start, 1e-9)


class CharCorpus:
    def __init__(self, valid_fraction: float = 0.05):
        import pydoc_data.topics

        topics = pydoc_data.topics.topics
        text = "\n\n".join(topics[k] for k in sorted(topics))
        self.chars = sorted(set(text))
        lookup = {c: i for i, c in enumerate(self.chars)}
        data = np.array([lookup[c] for c in text], dtype=np.int32)
        split = int((1 - valid_fraction) * len(data))
        self.train, self.valid = data[:split], data[split:]
        self.size = len(data)

    @property
    def vocab(self) -> int:
        return len(self.chars)

    def batch(self, rng: np.random.Generator, split: str, batch_size: int, seq_len: int):
        """(inputs, targets) int32 [batch_size, seq_len], targets shifted by one."""
        source = self.train if split == "train" else self.valid
        starts = rng.integers(0, len(source) - seq_len - 1, batch_size)
        x = np.stack([source[s : s + seq_len] for s in starts])
        y = np.stack([source[s + 1 : s + seq_len + 1] for s in starts])
        return x, y

    def encode(self, text: str) -> list:
        """Token ids of text's characters (those outside the vocabulary dropped; never empty)."""
        lookup = {c: i for i, c in enumerate(self.chars)}
        return [lookup[c] for c in text if c in lookup] or [0]

    def decode(self, tokens) -> str:
        return "".join(self.chars[int(t)] for t in tokens)


def progress(iterable, total: int, enabled: bool = True):
    """A tqdm progress bar when tqdm is installed (and enabled), else the plain iterable."""
    if enabled:
        try:
            from tqdm import tqdm

            return tqdm(iterable, total=total, dynamic_ncols=True)
        except ImportError:
            pass
    return iterable


def log_step(bar, history: list, step: int, loss: float, val_loss: float, meter: Throughput):
    """Prints the `step ... loss ... tokens/s` line (through the progress bar
    when there is one) and appends the point to `history`."""
    rate = meter.rate()
    line = f"step {step:5d}  loss {loss:.4f}  val_loss {val_loss:.4f}  {rate:,.0f} tokens/s"
    if hasattr(bar, "set_postfix_str"):
        bar.set_postfix_str(f"loss {loss:.3f} {rate:,.0f} tok/s")
        bar.write(line)
    else:
        print(line, flush=True)
    history.append({"step": step, "loss": loss, "val_loss": val_loss, "tokens_per_s": rate})


def save_loss_curve(history, path: str) -> bool:
    """Writes train/valid loss against step as a PNG (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    steps = [h["step"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, [h["loss"] for h in history], label="train")
    ax.plot(steps, [h["val_loss"] for h in history], label="valid")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/char)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def sample_text(logits_fn, corpus: CharCorpus, seq_len: int, prompt: str, length: int,
                seed: int = 0, temperature: float = 0.8) -> str:
    """Autoregressive sampling with a fixed [1, seq_len] window (one compilation:
    causal attention makes the padding after the last real token irrelevant).

    logits_fn: int32 [1, seq_len] -> float [1, seq_len, vocab] (jitted by the caller).
    """
    rng = np.random.default_rng(seed)
    lookup = {c: i for i, c in enumerate(corpus.chars)}
    tokens = [lookup[c] for c in prompt if c in lookup] or [0]
    for _ in range(length):
        window = tokens[-seq_len:]
        x = np.zeros((1, seq_len), np.int32)
        x[0, : len(window)] = window
        logits = np.asarray(logits_fn(x))[0, len(window) - 1].astype(np.float64) / temperature
        probs = np.exp(logits - logits.max())
        tokens.append(int(rng.choice(len(probs), p=probs / probs.sum())))
    return corpus.decode(tokens)


def apply_rope(x, base: float = 10000.0, positions=None):
    """Rotary position embedding on [..., T, N, H] (H even): channel pairs
    (i, i + H/2) of position t rotate by t * base^(-2i/H).

    positions: int [T] or [B, T] (decoding: each sequence's new tokens sit at
    their own offset); default 0..T-1.
    """
    import jax.numpy as jnp

    t, h = x.shape[-3], x.shape[-1]
    if positions is None:
        positions = jnp.arange(t)
    inv_freq = base ** (-jnp.arange(0, h // 2, dtype=jnp.float32) * 2 / h)  # [H/2]
    angles = jnp.asarray(positions, jnp.float32)[..., None] * inv_freq  # [(B,) T, H/2]
    cos, sin = (f(angles)[..., None, :].astype(x.dtype) for f in (jnp.cos, jnp.sin))  # [(B,) T, 1, H/2]
    x1, x2 = x[..., : h // 2], x[..., h // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def write_run_outputs(out_dir: str, args, history, sample: str) -> None:
    """metrics.json (args + history), loss_curve.png and sample.txt in out_dir."""
    import json
    import os

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump({"args": vars(args), "history": history}, f, indent=1)
    save_loss_curve(history, os.path.join(out_dir, "loss_curve.png"))
    with open(os.path.join(out_dir, "sample.txt"), "w") as f:
        f.write(sample)
