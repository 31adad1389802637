"""The examples' corpus: the Python reference documentation that ships with
CPython (`pydoc_data.topics`, ~465k characters of English prose and grammar),
so nothing is downloaded. Character-level tokens."""

from __future__ import annotations

import numpy as np


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

    def decode(self, tokens) -> str:
        return "".join(self.chars[int(t)] for t in tokens)
